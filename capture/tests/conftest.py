"""Shared helpers for the capture tests (pytest; not registered in Bazel).

AOTInductor compiles cost ~15 s each on two cores, so every capture that
compiles is a module-scoped fixture shared by the tests that read it.
"""

import hashlib
import os
import warnings

import torch

import proto.artifact_pb2 as pb


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torch.jit")
    config.addinivalue_line("filterwarnings", "ignore:.*TorchScript.*:DeprecationWarning")


def read_manifest(directory) -> pb.Manifest:
    m = pb.Manifest()
    with open(os.path.join(directory, "MANIFEST.pb"), "rb") as f:
        m.ParseFromString(f.read())
    return m


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def files_on_disk(directory):
    out = set()
    for dirpath, _, names in os.walk(directory):
        for name in names:
            out.add(os.path.relpath(os.path.join(dirpath, name), directory).replace(os.sep, "/"))
    return out


def frame_proto(manifest, name):
    for f in manifest.frames:
        if f.name == name:
            return f
    raise AssertionError(f"no frame {name} in {[f.name for f in manifest.frames]}")


def jit_load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(path)
