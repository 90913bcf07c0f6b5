"""A mutation pass over the checks that decide how a call is served.

Each mutant deletes or inverts one check in runtime/guard_program.cc,
runtime/loaded_version.cc, server/api/tensor_codec.cc or runtime/value.cc; the tests that should notice
run, and the mutant is recorded as killed (a test failed) or survived. The
source is restored after each mutant, also when interrupted.

    .venv/bin/python tests/mutants.py           every mutant (about 40 minutes on 2 cores)
    .venv/bin/python tests/mutants.py 3 7       mutants 3 and 7

tests/README.md records the last pass and says why each survivor is harmless.
"""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ["//runtime:guard_program_test", "//runtime:loaded_version_test", "//server/api:tensor_codec_test",
         "//tests:server_e2e_test", "//tests/fuzz:fuzz_regression_test",
         "//tests/guards:guard_agreement_test", "//gallery:gallery_test"]

# (file, text replaced, replacement, what the mutant does)
MUTANTS = [
    ("runtime/guard_program.cc", "case Op::kGradMode: return state.grad_enabled == (c.value != 0);",
     "case Op::kGradMode: return true;", "grad mode never checked"),
    ("runtime/guard_program.cc", "return static_cast<int64_t>(state.default_dtype) == c.value;",
     "return true;", "default dtype never checked"),
    ("runtime/guard_program.cc", "case Op::kIsNone: return a.kind == ArgView::Kind::kNone;",
     "case Op::kIsNone: return true;", "None never checked"),
    ("runtime/guard_program.cc", "case Op::kIsTensor: return a.kind == ArgView::Kind::kTensor;",
     "case Op::kIsTensor: return true;", "tensor-ness never checked"),
    ("runtime/guard_program.cc", "case Op::kDType: return static_cast<int64_t>(a.dtype) == c.value;",
     "case Op::kDType: return true;", "dtype never checked"),
    ("runtime/guard_program.cc", "case Op::kDevice: return static_cast<int64_t>(a.device) == c.value;",
     "case Op::kDevice: return true;", "device never checked"),
    ("runtime/guard_program.cc", "case Op::kRank: return a.rank == c.value;",
     "case Op::kRank: return true;", "rank never checked"),
    ("runtime/guard_program.cc", "case Op::kStaticSize: return a.sizes[c.dim] == c.value;",
     "case Op::kStaticSize: return true;", "static sizes never checked"),
    ("runtime/guard_program.cc", "if (size < c.value || (c.has_max && size > c.max)) return false;",
     "if (c.has_max && size > c.max) return false;", "a symbol's lower bound never checked"),
    ("runtime/guard_program.cc", "if (size < c.value || (c.has_max && size > c.max)) return false;",
     "if (size < c.value) return false;", "a symbol's upper bound never checked"),
    ("runtime/guard_program.cc", "case Op::kSymbolEqual: return a.sizes[c.dim] == symbols[c.slot];",
     "case Op::kSymbolEqual: return true;", "sizes sharing a symbol never compared"),
    ("runtime/guard_program.cc", "a.kind == ArgView::Kind::kBool && a.bool_value == (c.value != 0);",
     "a.kind == ArgView::Kind::kBool;", "bool values never compared"),
    ("runtime/guard_program.cc", "a.kind == ArgView::Kind::kInt && a.int_value == c.value;",
     "a.kind == ArgView::Kind::kInt;", "int values never compared"),
    ("runtime/guard_program.cc", "(std::isnan(a.float_value) && std::isnan(c.float_value)));",
     "false);", "NaN never equal to NaN"),
    ("runtime/guard_program.cc", "a.string_value == strings_[c.value];", "true;",
     "string values never compared"),
    ("runtime/loaded_version.cc", "          host = host.clone();", "          (void)0;",
     "an output sharing a request tensor's memory is not copied"),
    ("runtime/loaded_version.cc", "  if (!outside) return absl::OkStatus();", "  return absl::OkStatus();",
     "index ranges never checked"),
    ("runtime/loaded_version.cc", "    if (!IsTensor(leaves[i])) {", "    if (false) {",
     "a non-tensor where a tensor output belongs goes unnoticed"),
    ("runtime/loaded_version.cc", "  if (!frame.proto->eager_fallback()) {", "  if (false) {",
     "an unflagged frame's miss is not refused"),
    ("server/api/tensor_codec.cc", "    if (raw.size() != expected_bytes) {", "    if (false) {",
     "raw byte counts never checked against shapes"),
    ("runtime/value.cc", "    if (d < 0) {", "    if (false) {", "negative dimensions accepted"),
    ("runtime/value.cc", "    if (spanned > kMaxBytes / per_element / size) {", "    if (false) {",
     "element counts may overflow"),
    ("runtime/value.cc", "std::max<uint64_t>(static_cast<uint64_t>(d), 1)", "static_cast<uint64_t>(d)",
     "an empty tensor's strides may overflow"),
]


def run(index: int) -> str:
    path, old, new, what = MUTANTS[index]
    source = ROOT / path
    original = source.read_text()
    if original.count(old) < 1:
        return f"mutant {index} ({what}): NOT APPLIED, the text is not in {path}"
    try:
        source.write_text(original.replace(old, new, 1))
        result = subprocess.run(["bazel", "test", *TESTS, "--keep_going"], cwd=ROOT,
                                capture_output=True, text=True)
    finally:
        source.write_text(original)
    if result.returncode == 0:
        return f"mutant {index} ({what}): SURVIVED"
    failed = re.findall(r"^(//\S+)\s+(?:FAILED|NO STATUS)", result.stdout + result.stderr, re.M)
    return f"mutant {index} ({what}): killed by {' '.join(failed) or 'the build'}"


if __name__ == "__main__":
    for i in [int(a) for a in sys.argv[1:]] or range(len(MUTANTS)):
        print(run(i), flush=True)
