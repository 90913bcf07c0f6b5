"""Which module defines an operator that compiled code calls: what the
server imports to register it."""

import warnings

import pytest
import torch

from precompile_capture.called_operators import manifest_operators, python_module


@torch.library.custom_op("precompile_test_called::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


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
