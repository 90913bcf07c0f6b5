"""The runtime's guard evaluator, one child process per test file."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from evaluators import GuardEval  # noqa: E402


@pytest.fixture(scope="module")
def runtime():
    evaluator = GuardEval()
    yield evaluator
    evaluator.close()
