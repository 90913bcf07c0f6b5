// Guard dispatch cost: FrameDispatcher::Match, GuardProgram::Matches and
// FrameDispatcher::ExplainMiss on frames of 1, 8 and 64 variants.
//
// The frame is `forward(x, y, n)`, the shape of what precompile_capture
// writes for `(x * y[:, None]).sum() + n` (bench/dynamo_guards.py compiles
// the same function under Dynamo, so the two benchmarks compare like with
// like). Every variant guards the global state (grad mode, default dtype),
// x and y (tensor, dtype, device, rank, sizes) and n == 0:
//
//   static   variant i: x: float32[2+i, 16], y: float32[2+i]
//   symbolic variant i: x: float32[s0 in [2, inf), 4+i], y: float32[s0]
//            (s0 is one size symbol shared by x.size(0) and y.size(0))
//
// Cases, for each kind and variant count N:
//   Match/hit_mru        the call matches the most recently hit variant
//                        (the steady state of a repeated shape)
//   Scan/hit_first       Matches() in capture order, the first variant holds
//   Scan/hit_last        Matches() in capture order, only the last holds:
//                        what Match() does after a wrong MRU guess
//                        (N programs evaluated)
//   Match/alternate      two shapes interleaved (variants 0 and N-1): the MRU
//                        guess is wrong on every call; ns per call
//   Match/miss           no variant holds (Match returns -1)
//   ExplainMiss          the refusal's explanation for that miss (builds
//                        strings: runs only on refusals and first warnings)
//
// Run: bazel run --config=opt //bench:guard_dispatch_bench
//      (bench/run_guard_bench.sh pins it to one core and writes JSON).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/artifact.pb.h"
#include "runtime/frame_dispatcher.h"
#include "runtime/guard_program.h"

namespace precompile {
namespace {

enum class Kind { kStatic = 0, kSymbolic = 1 };

const std::vector<std::string> kParameterNames = {"x", "y", "n"};

void AddDim(artifact::v1::TensorGuard* t, int64_t size) { t->add_dims()->set_static_size(size); }

void AddSymbolDim(artifact::v1::TensorGuard* t, uint32_t symbol) {
  t->add_dims()->set_symbol(symbol);
}

// Variant `i` of the benchmark frame, as the capture tool writes it.
artifact::v1::Variant MakeVariant(Kind kind, int i) {
  artifact::v1::Variant v;
  v.set_id("forward#" + std::to_string(i));
  v.set_package_path("frames/forward/" + std::to_string(i) + ".pt2");
  v.mutable_global_state()->set_grad_enabled(false);
  v.mutable_global_state()->set_default_dtype(artifact::v1::DTYPE_FLOAT32);
  auto* x = v.add_guards();
  x->set_parameter(0);
  auto* xt = x->mutable_tensor();
  xt->set_dtype(artifact::v1::DTYPE_FLOAT32);
  xt->set_device("cpu");
  auto* y = v.add_guards();
  y->set_parameter(1);
  auto* yt = y->mutable_tensor();
  yt->set_dtype(artifact::v1::DTYPE_FLOAT32);
  yt->set_device("cpu");
  if (kind == Kind::kStatic) {
    AddDim(xt, 2 + i);
    AddDim(xt, 16);
    AddDim(yt, 2 + i);
  } else {
    auto* s0 = v.add_symbols();
    s0->set_symbol(0);
    s0->set_min(2);
    s0->set_name("s0");
    AddSymbolDim(xt, 0);
    AddDim(xt, 4 + i);
    AddSymbolDim(yt, 0);
  }
  auto* n = v.add_guards();
  n->set_parameter(2);
  n->mutable_equals()->set_int_value(0);
  v.add_tensor_inputs(0);
  v.add_tensor_inputs(1);
  v.set_num_outputs(1);
  return v;
}

std::vector<GuardProgram> Compile(Kind kind, int num_variants) {
  std::vector<GuardProgram> programs;
  for (int i = 0; i < num_variants; ++i) {
    absl::StatusOr<GuardProgram> p = GuardProgram::Compile(MakeVariant(kind, i), kParameterNames);
    if (!p.ok()) {
      fprintf(stderr, "guard program does not compile: %s\n",
              std::string(p.status().message()).c_str());
      abort();
    }
    programs.push_back(*std::move(p));
  }
  return programs;
}

// One call's arguments, and the views the runtime would pass to Match().
struct Call {
  int64_t x_sizes[2];
  int64_t y_sizes[1];
  std::vector<ArgView> views;

  Call(int64_t x0, int64_t x1, int64_t y0) : x_sizes{x0, x1}, y_sizes{y0} {
    views.resize(3);
    views[0].kind = ArgView::Kind::kTensor;
    views[0].dtype = DType::kFloat32;
    views[0].rank = 2;
    views[0].sizes = x_sizes;
    views[1].kind = ArgView::Kind::kTensor;
    views[1].dtype = DType::kFloat32;
    views[1].rank = 1;
    views[1].sizes = y_sizes;
    views[2].kind = ArgView::Kind::kInt;
    views[2].int_value = 0;
  }
  Call(const Call&) = delete;
};

// A call that matches variant `i` (and no other).
std::unique_ptr<Call> CallFor(Kind kind, int i) {
  if (kind == Kind::kStatic) return std::make_unique<Call>(2 + i, 16, 2 + i);
  return std::make_unique<Call>(8, 4 + i, 8);
}

// A call that matches no variant: a batch size / feature count none has.
std::unique_ptr<Call> MissingCall(Kind kind) {
  if (kind == Kind::kStatic) return std::make_unique<Call>(1000, 16, 1000);
  return std::make_unique<Call>(8, 1000, 8);
}

const GlobalState kState{/*grad_enabled=*/false, DType::kFloat32};

Kind KindOf(const benchmark::State& state) { return static_cast<Kind>(state.range(0)); }
int VariantsOf(const benchmark::State& state) { return static_cast<int>(state.range(1)); }

void Label(benchmark::State& state) {
  state.SetLabel(KindOf(state) == Kind::kStatic ? "static" : "symbolic");
}

void BM_Match_HitMru(benchmark::State& state) {
  const Kind kind = KindOf(state);
  FrameDispatcher dispatcher(Compile(kind, VariantsOf(state)));
  auto call = CallFor(kind, 0);
  if (dispatcher.Match(call->views, kState) != 0) state.SkipWithError("no hit");
  for (auto _ : state) {
    benchmark::DoNotOptimize(dispatcher.Match(call->views, kState));
  }
  Label(state);
}

// Matches() over the programs in capture order until one holds.
int Scan(const std::vector<GuardProgram>& programs, absl::Span<const ArgView> views) {
  for (int i = 0; i < static_cast<int>(programs.size()); ++i) {
    if (programs[i].Matches(views, kState)) return i;
  }
  return -1;
}

void BM_Scan_HitFirst(benchmark::State& state) {
  const Kind kind = KindOf(state);
  const std::vector<GuardProgram> programs = Compile(kind, VariantsOf(state));
  auto call = CallFor(kind, 0);
  if (Scan(programs, call->views) != 0) state.SkipWithError("no hit");
  for (auto _ : state) {
    benchmark::DoNotOptimize(Scan(programs, call->views));
  }
  Label(state);
}

void BM_Scan_HitLast(benchmark::State& state) {
  const Kind kind = KindOf(state);
  const int n = VariantsOf(state);
  const std::vector<GuardProgram> programs = Compile(kind, n);
  auto call = CallFor(kind, n - 1);
  if (Scan(programs, call->views) != n - 1) state.SkipWithError("no hit");
  for (auto _ : state) {
    benchmark::DoNotOptimize(Scan(programs, call->views));
  }
  Label(state);
}

// Two shapes interleaved: each call's MRU guess is the other shape's variant.
void BM_Match_Alternate(benchmark::State& state) {
  const Kind kind = KindOf(state);
  const int n = VariantsOf(state);
  FrameDispatcher dispatcher(Compile(kind, n));
  auto first = CallFor(kind, 0);
  auto last = CallFor(kind, n - 1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(dispatcher.Match(last->views, kState));
    benchmark::DoNotOptimize(dispatcher.Match(first->views, kState));
  }
  state.SetItemsProcessed(2 * state.iterations());
  Label(state);
}

void BM_Match_Miss(benchmark::State& state) {
  const Kind kind = KindOf(state);
  FrameDispatcher dispatcher(Compile(kind, VariantsOf(state)));
  auto call = MissingCall(kind);
  if (dispatcher.Match(call->views, kState) != -1) state.SkipWithError("hit");
  for (auto _ : state) {
    benchmark::DoNotOptimize(dispatcher.Match(call->views, kState));
  }
  Label(state);
}

void BM_ExplainMiss(benchmark::State& state) {
  const Kind kind = KindOf(state);
  FrameDispatcher dispatcher(Compile(kind, VariantsOf(state)));
  auto call = MissingCall(kind);
  if (!dispatcher.ExplainMiss(call->views, kState)) state.SkipWithError("no explanation");
  for (auto _ : state) {
    auto why = dispatcher.ExplainMiss(call->views, kState);
    benchmark::DoNotOptimize(why);
  }
  Label(state);
  if (auto why = dispatcher.ExplainMiss(call->views, kState)) {
    state.SetLabel((kind == Kind::kStatic ? "static: " : "symbolic: ") + why->reason);
  }
}

// Compiling a program: done once per variant at load time, for scale only.
void BM_Compile(benchmark::State& state) {
  const Kind kind = KindOf(state);
  const artifact::v1::Variant v = MakeVariant(kind, 0);
  for (auto _ : state) {
    auto p = GuardProgram::Compile(v, kParameterNames);
    benchmark::DoNotOptimize(p);
  }
  Label(state);
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"symbolic", "variants"});
  for (int kind : {0, 1}) {
    for (int n : {1, 8, 64}) b->Args({kind, n});
  }
}

BENCHMARK(BM_Match_HitMru)->Apply(Args);
BENCHMARK(BM_Scan_HitFirst)->Apply(Args);
BENCHMARK(BM_Scan_HitLast)->Apply(Args);
BENCHMARK(BM_Match_Alternate)->Apply(Args);
BENCHMARK(BM_Match_Miss)->Apply(Args);
BENCHMARK(BM_ExplainMiss)->Apply(Args);
BENCHMARK(BM_Compile)->ArgNames({"symbolic", "variants"})->Args({0, 1})->Args({1, 1});

}  // namespace
}  // namespace precompile

BENCHMARK_MAIN();
