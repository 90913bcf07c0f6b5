#!/usr/bin/env bash
# Runs Python test files with pytest in the project's virtual environment.
# Usage: run_pytest.sh PYTHON [NAME=PATH ...] TEST_FILE...
# NAME=PATH arguments are exported as absolute paths (runfiles of the test).
set -euo pipefail
python=$1
shift
while (($#)) && [[ $1 =~ ^[A-Z_]+= ]]; do
  name=${1%%=*}
  value=${1#*=}
  if [[ $value != /* && -e $value ]]; then value=$PWD/$value; fi
  export "$name=$value"
  shift
done
export PYTHONDONTWRITEBYTECODE=1
# JUnit XML per test case for tools/test_summary.py.
exec "$python" -m pytest -q -p no:cacheprovider -o junit_family=xunit1 \
  --junitxml="${XML_OUTPUT_FILE:-$TEST_TMPDIR/pytest.xml}" "$@"
