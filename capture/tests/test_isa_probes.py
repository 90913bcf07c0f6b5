"""The capture loads Inductor's vector ISA probes without importing torch
(compiling._load_isa_probes_without_torch): some 10 s less of every process
that captures. The ISAs it finds must be the ones Inductor's own check
finds, which this compares in two fresh processes.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

FOUND = """
import json, sys
sys.path.insert(0, {capture!r})
from torch._inductor import cpu_vec_isa
if {patched}:
    from precompile_capture.compiling import _load_isa_probes_without_torch
    _load_isa_probes_without_torch()
print(json.dumps([[str(isa), sorted((k, v) for k, v in vars(isa).items() if k.startswith("_is"))]
                  for isa in cpu_vec_isa.valid_vec_isa_list()] + [str(cpu_vec_isa.pick_vec_isa())]))
"""


def found(patched: bool):
    code = FOUND.format(capture=str(ROOT / "capture"), patched=patched)
    env = dict(os.environ, TORCHINDUCTOR_VEC_ISA_OK="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_isas_found_are_inductor_s_own():
    assert found(patched=True) == found(patched=False)
