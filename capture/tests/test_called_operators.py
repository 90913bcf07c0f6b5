"""Which module defines an operator that compiled code calls: what the
server imports to register it.

One AOTInductor compile."""

import warnings

import pytest
import torch

from precompile_capture.called_operators import manifest_operators, python_module


@torch.library.custom_op("precompile_test_called::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_operator_defined_with_custom_op_is_found_in_its_module():
    assert python_module("precompile_test_called::twice") == __name__
    assert python_module("precompile_test_called::twice.default") == __name__


def test_operators_no_module_defines_are_warned_of_by_name():
    with pytest.warns(RuntimeWarning, match=r"model 'm': its compiled code calls somelib::fused, which no "
                                            r"importable Python module defines .*--op_library"):
        operators = manifest_operators("m", ["somelib::fused", "precompile_test_called::twice",
                                             "somelib::fused"])
    assert operators == {"precompile_test_called::twice": __name__, "somelib::fused": ""}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manifest_operators("m", ["precompile_test_called::twice"]) == {
            "precompile_test_called::twice": __name__}


class Twice(torch.nn.Module):
    def forward(self, x):
        return twice(x + 1) * 3


def test_a_compiled_call_of_the_operator_is_recorded_with_its_module(tmp_path):
    # One AOTInductor compile: the package's calls are read back from it.
    import precompile_capture
    from conftest import read_manifest

    cap = precompile_capture.capture(Twice(), name="twice")
    try:
        x = torch.randn(4)
        assert torch.equal(cap(x), (x + 1) * 2 * 3)
        assert cap.operators() == {"precompile_test_called::twice": __name__}
        out = cap.save(tmp_path / "twice", require_complete=False)
    finally:
        cap.close()
    operators = read_manifest(out).operators
    assert [(op.name, op.python_module) for op in operators] == [("precompile_test_called::twice", __name__)]
    assert [m.name for m in read_manifest(out).python.modules] == [__name__.split(".")[0]]
