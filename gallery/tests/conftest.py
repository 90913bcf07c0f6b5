"""Shared by the gallery's tests: the real server serving the gallery's
artifacts on loopback, and the same models run eagerly.

The tests run under Bazel, from its runfiles: //gallery:gallery_test and
//gallery:tritonclient_test (tritonclient's protos and the project's share a
package name, so the two cannot be imported into one process).
"""

import os
import pathlib
import sys

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # Tiny configs: nothing to download.
# The runfiles tree (no resolve(): its files are links into the sources).
ROOT = pathlib.Path(os.path.abspath(__file__)).parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "testing"))

from server_process import ServerProcess  # noqa: E402

MODELS = ("bert", "roberta", "opt", "gpt2", "gpt2_decoder", "llama_decoder", "t5_decoder", "resnet18",
          "bert_recentering", "gpt2_decoder_recentering")
# The decoders again, as stateful models: the server keeps their caches.
STATEFUL_CONFIG = ROOT / "gallery" / "decoder_stateful.config.pbtxt"
STATEFUL = {"gpt2_decoder_stateful": ("gpt2_decoder", STATEFUL_CONFIG),
            "llama_decoder_stateful": ("llama_decoder", STATEFUL_CONFIG),
            "gpt2_decoder_recentering_stateful": ("gpt2_decoder_recentering", STATEFUL_CONFIG),
            "t5_decoder_stateful": ("t5_decoder", ROOT / "gallery" / "t5_decoder_stateful.config.pbtxt")}


def add_model(repository, name, artifact_name, config=None):
    """Serves gallery artifact `artifact_name` as model `name`, with
    `config` (config.pbtxt's text) if given."""
    (repository / name).mkdir()
    # The artifact's real directory: in runfiles each file is a link.
    artifact = (ROOT / "gallery" / artifact_name / "MANIFEST.pb").resolve().parent
    (repository / name / "1").symlink_to(artifact)
    if config is not None:
        (repository / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    for name in MODELS:
        add_model(repository, name, name)
    for name, (artifact, config) in STATEFUL.items():
        add_model(repository, name, artifact, config.read_text())
    # The *_recentering models' eager programs are Python: they carry
    # gallery.models' code by value, and the server imports transformers
    # from its environment.
    process = ServerProcess(ROOT / "server" / "precompile_server", repository,
                            ["--allow_python_programs",
                             # Well above any call here; a test runs past it.
                             "--max_request_seconds=10"])
    yield process
    assert process.stop() == 0, process.log()


def tokens(batch, sequence, seed):
    """Token ids and an attention mask whose first sequence is padded."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, (batch, sequence), dtype=np.int64)
    mask = np.ones((batch, sequence), dtype=np.int64)
    mask[0, sequence - 3:] = 0
    return ids, mask


def eager(factory, *args, **kwargs):
    """The gallery model `factory` builds, run eagerly on the arguments."""
    with torch.no_grad():
        return factory()(*args, **kwargs)
