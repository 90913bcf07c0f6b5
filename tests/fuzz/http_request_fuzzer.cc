// libFuzzer target: the HTTP endpoint's request decoding (server/http/http_codec.h)
// on arbitrary bytes. The check is in fuzz_checks.h (CheckHttpRequest);
// tests/fuzz/run_fuzzers.sh builds and runs this target,
// fuzz_regression_test replays its corpus.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return precompile::fuzz::RunFuzzCheck(precompile::fuzz::CheckHttpRequest,
                                        "http_request_fuzzer", data, size);
}
