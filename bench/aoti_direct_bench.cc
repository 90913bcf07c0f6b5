// The limit: a compiled variant called in process, without RPC.
//
// Three levels, each with 1, 8, 64 threads calling in a closed loop:
//   --mode=loader   torch::inductor::AOTIModelPackageLoader::boxed_run on the
//                   .pt2 (what AOTInductor's own C++ API costs)
//   --mode=variant  precompile::Variant::Run on the same package (the
//                   runtime's wrapper: contiguity checks, status conversion)
//   --mode=model    precompile::LoadedVersion::Call on the artifact directory (the
//                   runtime's whole call: argument binding, guard dispatch,
//                   from_blob, output conversion), with --params for
//                   non-tensor arguments (e.g. --params=n=1 on the `loop`
//                   example runs its eager fallback)
//
//   aoti_direct_bench --mode=loader --package=DIR/frames/forward/0.pt2
//       --shape=8,4 --threads=1,8,64 --duration=3 --json_out=out.json
//
// --inputs gives several tensor arguments instead of one (the gallery's BERT:
// --inputs='input_ids:int64:3x11;attention_mask:int64:3x11'), in the order
// the package takes them; int64 tensors hold small values (valid token ids).
//
// All modes run under c10::InferenceMode, as the server's calls do, with the
// same number of runners per variant as the server's default (2).
//
// --device=cuda (a CUDA package or artifact): libtorch_cuda is loaded as the
// server loads it (runtime/cuda_support.h); loader and variant modes take the
// input on the GPU and copy output0 back to the host, which waits for the
// kernels (the server copies outputs to the host too); model mode takes the
// input in host memory, as the server does.
#include <ATen/ops/arange.h>
#include <ATen/ops/randn.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/cuda_support.h"
#include "runtime/loaded_version.h"
#include "runtime/value.h"
#include "runtime/variant.h"

ABSL_FLAG(std::string, mode, "loader", "loader, variant or model");
ABSL_FLAG(std::string, package, "", "loader/variant: the .pt2 package");
ABSL_FLAG(std::string, artifact, "", "model: the artifact directory");
ABSL_FLAG(std::string, input, "x", "model: the tensor argument's name");
ABSL_FLAG(std::string, params, "", "model: int arguments, name=value,...");
ABSL_FLAG(std::string, shape, "8,4", "the float32 input's shape");
ABSL_FLAG(std::string, inputs, "",
          "name:dtype:d0xd1x...;... (dtype float32 or int64): several tensor arguments, "
          "replacing --input and --shape");
ABSL_FLAG(std::string, threads, "1,8,64", "calling threads, one phase each");
ABSL_FLAG(double, warmup, 0.5, "seconds not recorded before each phase");
ABSL_FLAG(double, duration, 3, "seconds recorded per phase");
ABSL_FLAG(int, num_runners, 2, "model instances per package (server default: 2)");
ABSL_FLAG(int, torch_threads, 0, "at::set_num_threads (0: torch's default)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, label, "", "a name for this run in the JSON");
ABSL_FLAG(std::string, json_out, "", "append one JSON line per phase to this file");

namespace {

using Clock = std::chrono::steady_clock;

struct PhaseResult {
  int threads = 0;
  int64_t calls = 0;
  int64_t errors = 0;
  double seconds = 0;
  std::vector<int64_t> latencies_ns;
};

double Percentile(std::vector<int64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  size_t i = static_cast<size_t>(p / 100.0 * (sorted.size() - 1) + 0.5);
  return static_cast<double>(sorted[std::min(i, sorted.size() - 1)]);
}

// Runs `call` from `threads` threads for warmup + duration seconds.
template <typename Fn>
PhaseResult RunPhase(int threads, double warmup, double duration, Fn call) {
  std::atomic<bool> recording{false};
  std::atomic<bool> stop{false};
  std::vector<std::vector<int64_t>> latencies(threads);
  std::vector<int64_t> errors(threads, 0);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      c10::InferenceMode inference_mode;
      latencies[t].reserve(1 << 16);
      while (!stop.load(std::memory_order_relaxed)) {
        const auto start = Clock::now();
        const bool ok = call();
        const auto end = Clock::now();
        if (recording.load(std::memory_order_relaxed)) {
          latencies[t].push_back(
              std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count());
          if (!ok) ++errors[t];
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
  const auto begin = Clock::now();
  recording.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(duration));
  recording.store(false);
  const auto end = Clock::now();
  stop.store(true);
  for (auto& w : workers) w.join();
  PhaseResult r;
  r.threads = threads;
  r.seconds = std::chrono::duration<double>(end - begin).count();
  for (int t = 0; t < threads; ++t) {
    r.latencies_ns.insert(r.latencies_ns.end(), latencies[t].begin(), latencies[t].end());
    r.errors += errors[t];
  }
  r.calls = static_cast<int64_t>(r.latencies_ns.size());
  std::sort(r.latencies_ns.begin(), r.latencies_ns.end());
  return r;
}

std::vector<int64_t> ParseInts(const std::string& text, char separator = ',') {
  std::vector<int64_t> values;
  for (absl::string_view part : absl::StrSplit(text, separator, absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      fprintf(stderr, "not an integer: %s\n", std::string(part).c_str());
      exit(2);
    }
    values.push_back(v);
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (absl::GetFlag(FLAGS_torch_threads) > 0)
    at::set_num_threads(absl::GetFlag(FLAGS_torch_threads));
  // The tensor arguments, by name, in host memory.
  std::vector<std::pair<std::string, at::Tensor>> host_inputs;
  if (absl::GetFlag(FLAGS_inputs).empty()) {
    host_inputs.emplace_back(absl::GetFlag(FLAGS_input),
                             at::randn(ParseInts(absl::GetFlag(FLAGS_shape)), at::kFloat));
  }
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_inputs), ';', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(spec, ':');
    if (parts.size() != 3 || (parts[1] != "float32" && parts[1] != "int64")) {
      fprintf(stderr, "--inputs takes name:float32|int64:d0xd1...: %s\n", std::string(spec).c_str());
      return 2;
    }
    const std::vector<int64_t> dims = ParseInts(parts[2], 'x');
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    host_inputs.emplace_back(parts[0], parts[1] == "int64"
                                           ? at::arange(n, at::kLong).remainder(97).reshape(dims)
                                           : at::randn(dims, at::kFloat));
  }
  const std::vector<int64_t> shape = host_inputs.front().second.sizes().vec();
  std::vector<at::Tensor> inputs;
  for (const auto& [name, t] : host_inputs) inputs.push_back(t);
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (cuda) {
    if (absl::Status s = precompile::LoadCudaSupport(); !s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    for (at::Tensor& t : inputs) t = t.to(at::kCUDA);
  } else if (absl::GetFlag(FLAGS_device) != "cpu") {
    fprintf(stderr, "--device is cpu or cuda\n");
    return 2;
  }

  std::function<bool()> call;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  std::unique_ptr<precompile::Variant> variant;
  std::shared_ptr<precompile::LoadedVersion> model;
  std::vector<precompile::NamedValue> args;

  if (mode == "loader") {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        absl::GetFlag(FLAGS_package), "model", false,
        static_cast<size_t>(absl::GetFlag(FLAGS_num_runners)));
    call = [&] {
      std::vector<at::Tensor> out = loader->boxed_run(std::vector<at::Tensor>(inputs));
      if (cuda && !out.empty()) out[0] = out[0].cpu();
      return !out.empty();
    };
  } else if (mode == "variant") {
    precompile::VariantOptions options;
    options.num_runners = absl::GetFlag(FLAGS_num_runners);
    if (cuda) options.device = precompile::DeviceType::kCuda;
    auto loaded = precompile::Variant::Load("bench", absl::GetFlag(FLAGS_package), options);
    if (!loaded.ok()) {
      fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      return 1;
    }
    variant = *std::move(loaded);
    call = [&] {
      auto out = variant->Run(inputs);
      if (cuda && out.ok() && !out->empty()) (*out)[0] = (*out)[0].cpu();
      return out.ok();
    };
  } else if (mode == "model") {
    precompile::LoadOptions options;
    options.runners_per_variant = absl::GetFlag(FLAGS_num_runners);
    auto loaded = precompile::LoadedVersion::Load(absl::GetFlag(FLAGS_artifact), options);
    if (!loaded.ok()) {
      fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      return 1;
    }
    model = *std::move(loaded);
    for (const auto& [name, t] : host_inputs) {
      precompile::TensorArg tensor;
      tensor.dtype = t.scalar_type() == at::kLong ? precompile::DType::kInt64
                                                  : precompile::DType::kFloat32;
      tensor.shape = t.sizes().vec();
      tensor.data = t.data_ptr();
      tensor.nbytes = t.nbytes();
      args.push_back({name, tensor});
    }
    for (absl::string_view kv :
         absl::StrSplit(absl::GetFlag(FLAGS_params), ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      int64_t v;
      if (!absl::SimpleAtoi(p.second, &v)) {
        fprintf(stderr, "--params takes name=int: %s\n", std::string(kv).c_str());
        return 2;
      }
      args.push_back({p.first, v});
    }
    auto first = model->Call(args);
    if (!first.ok()) {
      fprintf(stderr, "the call fails: %s\n", first.status().ToString().c_str());
      return 1;
    }
    fprintf(stderr, "served as %s %s\n",
            std::string(precompile::OutcomeName(first->outcome)).c_str(),
            first->variant_id.c_str());
    call = [&] { return model->Call(args).ok(); };
  } else {
    fprintf(stderr, "--mode is loader, variant or model\n");
    return 2;
  }

  std::ofstream json;
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    json.open(absl::GetFlag(FLAGS_json_out), std::ios::app);
  }
  const std::string label = absl::GetFlag(FLAGS_label).empty() ? mode : absl::GetFlag(FLAGS_label);
  printf("%-24s %7s %10s %10s %10s %10s %10s\n", "RUN", "THREADS", "CALLS/S", "P50 us", "P90 us",
         "P99 us", "MEAN us");
  for (int64_t threads : ParseInts(absl::GetFlag(FLAGS_threads))) {
    PhaseResult r = RunPhase(static_cast<int>(threads), absl::GetFlag(FLAGS_warmup),
                             absl::GetFlag(FLAGS_duration), call);
    double sum = 0;
    for (int64_t l : r.latencies_ns) sum += static_cast<double>(l);
    const double mean_us = r.calls ? sum / r.calls / 1e3 : 0;
    const double p50 = Percentile(r.latencies_ns, 50) / 1e3;
    const double p90 = Percentile(r.latencies_ns, 90) / 1e3;
    const double p99 = Percentile(r.latencies_ns, 99) / 1e3;
    const double rate = r.calls / r.seconds;
    printf("%-24s %7d %10.0f %10.1f %10.1f %10.1f %10.1f\n", label.c_str(), r.threads, rate, p50,
           p90, p99, mean_us);
    fflush(stdout);
    if (json.is_open()) {
      json << absl::StrFormat(
          "{\"label\": \"%s\", \"mode\": \"%s\", \"shape\": [%s], \"threads\": %d, "
          "\"calls\": %d, \"errors\": %d, \"seconds\": %.3f, \"throughput_cps\": %.1f, "
          "\"p50_us\": %.2f, \"p90_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f}\n",
          label, mode, absl::StrJoin(shape, ", "), r.threads, r.calls, r.errors, r.seconds, rate,
          p50, p90, p99, mean_us);
    }
    if (r.errors > 0)
      fprintf(stderr, "%s: %lld calls failed\n", label.c_str(), static_cast<long long>(r.errors));
  }
  return 0;
}
