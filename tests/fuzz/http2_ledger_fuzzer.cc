// libFuzzer target: the gRPC front's HTTP/2 ledger (server/grpc/http2_stream_ledger.h)
// on one connection's bytes, both ways. The check is in fuzz_checks.h
// (CheckHttp2Ledger); tests/fuzz/run_fuzzers.sh builds and runs this target,
// fuzz_regression_test replays its corpus.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return precompile::fuzz::RunFuzzCheck(precompile::fuzz::CheckHttp2Ledger, "http2_ledger_fuzzer",
                                        data, size);
}
