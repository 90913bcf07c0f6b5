// How fast the HTTP endpoint decodes JSON inference bodies: dense FP32
// values as tritonclient writes them, and nested empty arrays (what a body
// costs that holds no values at all, under the 64 KiB the decoder allows
// such a run).
#include <benchmark/benchmark.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/http/http_codec.h"

namespace precompile::server {
namespace {

std::string DenseBody(int64_t rows) {
  std::string body = absl::StrCat(R"({"inputs": [{"name": "x", "shape": [)", rows,
                                  R"(, 4], "datatype": "FP32", "data": [)");
  for (int64_t i = 0; i < rows * 4; ++i) absl::StrAppend(&body, i ? "," : "", "0.123456");
  body += "]}]}";
  return body;
}

std::string EmptyArraysBody(int64_t arrays) {
  std::string body = R"({"inputs": [{"name": "x", "shape": [0], "datatype": "FP32", "data": [)";
  for (int64_t i = 0; i < arrays; ++i) body += i ? ",[]" : "[]";
  body += "]}]}";
  return body;
}

void Decode(benchmark::State& state, const std::string& body) {
  for (auto _ : state) {
    inference::ModelInferRequest request;
    absl::Status status = DecodeInferRequest(body, std::nullopt, "m", "", &request);
    if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
    benchmark::DoNotOptimize(request);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(body.size()));
}

void BM_DecodeDenseFp32(benchmark::State& state) { Decode(state, DenseBody(state.range(0))); }
BENCHMARK(BM_DecodeDenseFp32)->Arg(1 << 10)->Arg(1 << 16)->Unit(benchmark::kMillisecond);

void BM_DecodeEmptyArrays(benchmark::State& state) {
  Decode(state, EmptyArraysBody(state.range(0)));
}
BENCHMARK(BM_DecodeEmptyArrays)->Arg(1 << 14)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace precompile::server

BENCHMARK_MAIN();
