"""remote_call.py against the real server binary on loopback.

Needs the Bazel build outputs: the server, the example artifacts and the
command-line client (bazel build //server:precompile_server //examples:artifacts
//client:precompile_client; `bazel test //...` builds them). Runs with the
project's environment: .venv/bin/python -m pytest client/python
"""

import pathlib
import subprocess
import sys

import grpc
import numpy as np
import pytest

import remote_call

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402
BIN = ROOT / "bazel-bin"
TOKEN = "python-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    copy_tree(built(BIN / "examples" / "mlp"), root / "repository" / "mlp" / "1")
    token_file = root / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # The server refuses a token file every user can read.
    process = ServerProcess(built(BIN / "server" / "precompile_server"), root / "repository",
                            [f"--admin_token_file={token_file}"])
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def channel(server):
    with grpc.insecure_channel(server.address) as channel:
        yield channel


def reference_mlp(x: np.ndarray) -> np.ndarray:
    """What the mlp example returns in Python (examples/models.py)."""
    import torch
    sys.path.insert(0, str(ROOT))
    from examples import models
    with torch.no_grad():
        return models.make_mlp()(torch.from_numpy(x)).numpy()


def test_infers_with_a_variant_and_says_which(channel):
    x = np.random.default_rng(1).standard_normal((8, 4), dtype=np.float32)
    result = remote_call.infer_mlp(channel, x)
    assert result.outcome == "variant"
    assert result.variant == "forward#0"
    assert result.output0.shape == (8, 3)
    np.testing.assert_allclose(result.output0, reference_mlp(x), rtol=1e-4, atol=1e-5)

    # Batch 16 hits the dynamic-batch variant.
    x16 = np.random.default_rng(2).standard_normal((16, 4), dtype=np.float32)
    result = remote_call.infer_mlp(channel, x16)
    assert result.variant == "forward#1"
    np.testing.assert_allclose(result.output0, reference_mlp(x16), rtol=1e-4, atol=1e-5)


def test_a_refusal_is_failed_precondition(channel):
    with pytest.raises(grpc.RpcError) as error:
        remote_call.infer_mlp(channel, np.zeros((1, 4), dtype=np.float32))
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no captured variant matches this call of frame 'forward'" in error.value.details()


def test_summary_needs_the_admin_token(channel):
    summary = remote_call.get_summary(channel, "mlp", TOKEN)
    assert summary.name == "mlp"
    assert summary.entry_frame == "forward"
    assert summary.complete
    assert dict(summary.variants_per_frame) == {"forward": 2}

    with pytest.raises(grpc.RpcError) as error:
        remote_call.get_summary(channel, "mlp")
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_cli_reads_and_writes_numpy_files(server, tmp_path):
    """precompile_client's .npy files are numpy's, both ways."""
    x = np.random.default_rng(3).standard_normal((5, 4), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    completed = subprocess.run(
        [str(built(BIN / "client" / "precompile_client")), "infer", "mlp",
         f"--address={server.address}", f"--input=x={tmp_path / 'x.npy'}",
         f"--output_dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "outcome:  variant (forward#1)" in completed.stdout
    y = np.load(tmp_path / "out" / "output0.npy")
    assert y.dtype == np.float32 and y.shape == (5, 3)
    np.testing.assert_allclose(y, reference_mlp(x), rtol=1e-4, atol=1e-5)
