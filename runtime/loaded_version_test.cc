// The runtime's serving semantics, on the bundled example artifacts captured
// by the capture tool, checked against the Python models' own outputs.
#include "runtime/loaded_version.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "base/notification.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/reference.h"

namespace precompile {
namespace {

using ::precompile::testing::AsTensor;
using ::precompile::testing::AsTensorArg;
using ::precompile::testing::ExampleArtifact;
using ::precompile::testing::Reference;
using ::precompile::testing::ReferenceCall;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::shared_ptr<LoadedVersion> Load(const std::string& example) {
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(ExampleArtifact(example), {});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : nullptr;
}

// Calls `model` with reference call `call` and checks the outputs against
// what the Python model returned.
CallResult CallAndCompare(LoadedVersion& model, const std::string& example,
                          const std::string& call) {
  ReferenceCall ref = Reference(example, call);
  absl::StatusOr<CallResult> result = model.Call(ref.args);
  EXPECT_TRUE(result.ok()) << example << "/" << call << ": " << result.status();
  if (!result.ok()) return {};
  EXPECT_EQ(result->outputs.size(), ref.expected.size());
  for (size_t i = 0; i < ref.expected.size() && i < result->outputs.size(); ++i) {
    at::Tensor got = AsTensor(result->outputs[i]);
    EXPECT_EQ(got.sizes(), ref.expected[i].sizes()) << example << "/" << call;
    EXPECT_TRUE(at::allclose(got, ref.expected[i], 1e-4, 1e-5))
        << example << "/" << call << " output " << i << "\ngot " << got
        << "\nexpected " << ref.expected[i];
  }
  return *std::move(result);
}

// Collects what the runtime logs.
class LogCapture {
 public:
  LogCapture() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  std::string text() const { return stream_.str(); }
  int Count(const std::string& needle) const {
    const std::string t = text();
    int n = 0;
    for (size_t at = t.find(needle); at != std::string::npos; at = t.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
};

uint64_t Calls(const LoadedVersion& model, const std::string& frame, Outcome outcome) {
  for (const FrameCoverage& c : model.Coverage()) {
    if (c.frame == frame) return c.calls_by_outcome[static_cast<int>(outcome)];
  }
  ADD_FAILURE() << "no frame " << frame;
  return 0;
}

uint64_t Hits(const LoadedVersion& model, const std::string& variant) {
  for (const FrameCoverage& c : model.Coverage()) {
    for (const auto& [id, hits] : c.variant_hits) {
      if (id == variant) return hits;
    }
  }
  ADD_FAILURE() << "no variant " << variant;
  return 0;
}

TEST(LoadedVersion, ServesTheStaticAndTheDynamicVariant) {
  auto model = Load("mlp");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(CallAndCompare(*model, "mlp", "batch8").variant_id, "forward#0");
  EXPECT_EQ(CallAndCompare(*model, "mlp", "batch16").variant_id, "forward#1");
  CallResult five = CallAndCompare(*model, "mlp", "batch5");
  EXPECT_EQ(five.outcome, Outcome::kVariant);
  EXPECT_EQ(five.variant_id, "forward#1");
  EXPECT_TRUE(model->manifest().summary().complete());
}

TEST(LoadedVersion, RefusesAMissOfAnUnflaggedFrameWithTheClosestVariantsFirstFailingGuard) {
  auto model = Load("mlp");
  ASSERT_NE(model, nullptr);
  // Batch 1 is specialized away from the dynamic variant (sizes 0 and 1 are
  // never symbolic) and is not 8 either.
  ReferenceCall ref = Reference("mlp", "batch1");
  absl::StatusOr<CallResult> result = model->Call(ref.args);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              AllOf(HasSubstr("no captured variant matches this call"),
                    HasSubstr("frame 'forward'"), HasSubstr("model 'mlp'"),
                    HasSubstr("x.size(0)")));

  at::Tensor doubles = at::ones({8, 4}, at::kDouble);
  result = model->Call({{"x", AsTensorArg(doubles)}});
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              HasSubstr("x.dtype: expected float32, got float64"));
  EXPECT_EQ(Calls(*model, "forward", Outcome::kRefused), 2u);
  // A refusal changes nothing: the next call is served.
  CallAndCompare(*model, "mlp", "batch8");
}

TEST(LoadedVersion, ARefusalPastASizeLimitNamesTheLimitThatAppliesToTheDimension) {
  // mlp's x, as if captured with --max-size x=6 --max-size x.0=100: the
  // first dimension's own limit overrides the every-dimension one.
  const std::string limited = testing::NewTempDirectory("limited");
  testing::CopyTree(ExampleArtifact("mlp"), limited);
  testing::EditManifest(limited, [](artifact::v1::Manifest& manifest) {
    artifact::v1::Frame& forward = *manifest.mutable_frames(0);
    artifact::v1::SizeLimit& every = *forward.add_size_limits();
    every.set_parameter("x");
    every.set_max(6);
    artifact::v1::SizeLimit& rows = *forward.add_size_limits();
    rows.set_parameter("x");
    rows.set_dim(0);
    rows.set_max(100);
  });
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model = LoadedVersion::Load(limited, {});
  ASSERT_TRUE(model.ok()) << model.status();
  // Misses by their dtype: within the limits, the failing guard is said.
  absl::StatusOr<CallResult> within =
      (*model)->Call({{"x", AsTensorArg(at::ones({16, 4}, at::kDouble))}});
  ASSERT_EQ(within.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(within.status().message(), AllOf(HasSubstr("x.dtype: expected float32, got float64"),
                                               Not(HasSubstr("--max-size"))));
  absl::StatusOr<CallResult> past =
      (*model)->Call({{"x", AsTensorArg(at::ones({101, 4}, at::kDouble))}});
  EXPECT_THAT(past.status().message(),
              HasSubstr("x.size(0) is 101, more than the 100 the model was captured to take at "
                        "most (--max-size)"));
  absl::StatusOr<CallResult> wide =
      (*model)->Call({{"x", AsTensorArg(at::ones({2, 7}, at::kDouble))}});
  EXPECT_THAT(wide.status().message(), HasSubstr("x.size(1) is 7, more than the 6"));
}

TEST(LoadedVersion, RunsAFlaggedFramesMissEagerlyAndWarnsOncePerFrame) {
  LogCapture logs;
  auto model = Load("loop");
  ASSERT_NE(model, nullptr);
  CallResult compiled = CallAndCompare(*model, "loop", "n0");
  EXPECT_EQ(compiled.outcome, Outcome::kVariant);
  EXPECT_EQ(logs.Count("frame 'forward' runs eagerly"), 0);

  CallResult eager = CallAndCompare(*model, "loop", "n1");
  EXPECT_EQ(eager.outcome, Outcome::kEagerFallback);
  EXPECT_EQ(eager.variant_id, "");
  EXPECT_EQ(logs.Count("frame 'forward' runs eagerly"), 1);
  const std::string log = logs.text();
  EXPECT_THAT(log, AllOf(HasSubstr("frame 'forward'"), HasSubstr("n: expected 0, got 1"),
                         HasSubstr("recapture with an example call that covers them"),
                         HasSubstr("TORCH_LOGS=graph_breaks"),
                         HasSubstr("TORCH_LOGS=recompiles) will not report this miss")));

  CallAndCompare(*model, "loop", "n3");
  CallAndCompare(*model, "loop", "wide_n0");
  EXPECT_EQ(logs.Count("frame 'forward' runs eagerly"), 1) << "later misses must not warn again";
  EXPECT_EQ(Calls(*model, "forward", Outcome::kEagerFallback), 3u);
  ASSERT_EQ(model->Warnings().size(), 1u);
  EXPECT_EQ(model->Warnings()[0].frame, "forward");

  // The compiled call is still served by its variant after the misses.
  EXPECT_EQ(CallAndCompare(*model, "loop", "n0").outcome, Outcome::kVariant);
  EXPECT_EQ(Hits(*model, "forward#0"), 2u);
}

TEST(LoadedVersion, ADeferredMissStopsBeforeItsEagerProgramAndRecordsNothing) {
  LogCapture logs;
  auto model = Load("loop");
  ASSERT_NE(model, nullptr);
  LoadedVersion::CallContext defer;
  defer.defer_entry_eager = true;
  ReferenceCall n1 = Reference("loop", "n1");
  absl::StatusOr<CallResult> deferred = model->Call(n1.args, defer);
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  EXPECT_TRUE(deferred->eager_deferred);
  EXPECT_EQ(deferred->outcome, Outcome::kEagerFallback);
  EXPECT_TRUE(deferred->outputs.empty());
  EXPECT_EQ(Calls(*model, "forward", Outcome::kEagerFallback), 0u);
  EXPECT_TRUE(model->Misses().empty());
  EXPECT_TRUE(model->Warnings().empty());
  EXPECT_EQ(logs.Count("frame 'forward' runs eagerly"), 0);

  // A hit is not deferred: its variant runs.
  ReferenceCall n0 = Reference("loop", "n0");
  absl::StatusOr<CallResult> hit = model->Call(n0.args, defer);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_FALSE(hit->eager_deferred);
  EXPECT_EQ(hit->variant_id, "forward#0");
  ASSERT_EQ(hit->outputs.size(), 1u);

  // The same call again, not deferred, runs the program and is recorded once.
  EXPECT_EQ(CallAndCompare(*model, "loop", "n1").outcome, Outcome::kEagerFallback);
  EXPECT_EQ(Calls(*model, "forward", Outcome::kEagerFallback), 1u);
  EXPECT_EQ(model->Warnings().size(), 1u);
}

TEST(LoadedVersion, AVariantOnlyCallRunsAHitAndStopsAtAMissRecordingNothing) {
  LogCapture logs;
  auto model = Load("mlp");
  ASSERT_NE(model, nullptr);
  LoadedVersion::CallContext variant_only;
  variant_only.variant_only = true;
  // Batch 1 is refused by a plain call; here it stops before the refusal.
  ReferenceCall batch1 = Reference("mlp", "batch1");
  absl::StatusOr<CallResult> missed = model->Call(batch1.args, variant_only);
  ASSERT_TRUE(missed.ok()) << missed.status();
  EXPECT_TRUE(missed->no_variant);
  EXPECT_TRUE(missed->outputs.empty());
  EXPECT_EQ(Calls(*model, "forward", Outcome::kRefused), 0u);
  EXPECT_TRUE(model->Misses().empty());

  ReferenceCall batch16 = Reference("mlp", "batch16");
  absl::StatusOr<CallResult> hit = model->Call(batch16.args, variant_only);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_FALSE(hit->no_variant);
  EXPECT_EQ(hit->variant_id, "forward#1");
  ASSERT_EQ(hit->outputs.size(), 1u);
  EXPECT_EQ(Calls(*model, "forward", Outcome::kVariant), 1u);

  // A flagged frame's miss stops before its eager program, and warns nothing.
  auto loop = Load("loop");
  ASSERT_NE(loop, nullptr);
  absl::StatusOr<CallResult> eager = loop->Call(Reference("loop", "n1").args, variant_only);
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_TRUE(eager->no_variant);
  EXPECT_EQ(Calls(*loop, "forward", Outcome::kEagerFallback), 0u);
  EXPECT_TRUE(loop->Warnings().empty());
  EXPECT_EQ(logs.Count("frame 'forward' runs eagerly"), 0);
}

TEST(LoadedVersion, AMatchOnlyCallNamesTheVariantWithoutRunningIt) {
  auto model = Load("mlp");
  ASSERT_NE(model, nullptr);
  LoadedVersion::CallContext match_only;
  match_only.match_only = true;
  absl::StatusOr<CallResult> batch8 = model->Call(Reference("mlp", "batch8").args, match_only);
  ASSERT_TRUE(batch8.ok()) << batch8.status();
  EXPECT_EQ(batch8->variant_id, "forward#0");
  EXPECT_TRUE(batch8->outputs.empty());
  absl::StatusOr<CallResult> batch5 = model->Call(Reference("mlp", "batch5").args, match_only);
  ASSERT_TRUE(batch5.ok()) << batch5.status();
  EXPECT_EQ(batch5->variant_id, "forward#1");
  absl::StatusOr<CallResult> batch1 = model->Call(Reference("mlp", "batch1").args, match_only);
  ASSERT_TRUE(batch1.ok()) << batch1.status();
  EXPECT_TRUE(batch1->no_variant);
  EXPECT_EQ(Calls(*model, "forward", Outcome::kVariant), 0u);
  EXPECT_EQ(Calls(*model, "forward", Outcome::kRefused), 0u);
  EXPECT_EQ(Hits(*model, "forward#0"), 0u);
}

TEST(LoadedVersion, ServesADataDependentBranchEagerly) {
  auto model = Load("branch");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(CallAndCompare(*model, "branch", "unchecked").outcome, Outcome::kVariant);
  EXPECT_EQ(CallAndCompare(*model, "branch", "checked").outcome, Outcome::kEagerFallback);
  EXPECT_EQ(model->entry_frame().fallback_cause(), artifact::v1::USER_ERROR);
}

TEST(LoadedVersion, AnEagerFramesCalleesKeepTheirVariantsAndRefuseTheirOwnMisses) {
  auto model = Load("nested");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(CallAndCompare(*model, "nested", "k0").outcome, Outcome::kVariant);
  EXPECT_EQ(Hits(*model, "encoder#0"), 0u) << "the entry's variant inlines its callees";

  EXPECT_EQ(CallAndCompare(*model, "nested", "k1").outcome, Outcome::kEagerFallback);
  EXPECT_EQ(CallAndCompare(*model, "nested", "k2").outcome, Outcome::kEagerFallback);
  EXPECT_EQ(Hits(*model, "encoder#0"), 2u);
  EXPECT_EQ(Hits(*model, "scale#0"), 2u);
  EXPECT_EQ(Calls(*model, "encoder", Outcome::kEagerFallback), 0u);
  // wobble is flagged with no variant: served eagerly from the start, and
  // with nothing compiled to lose it warns nothing; only forward warned.
  EXPECT_EQ(Calls(*model, "wobble", Outcome::kEagerFallback), 3u);
  ASSERT_EQ(model->Warnings().size(), 1u);
  EXPECT_EQ(model->Warnings()[0].frame, "forward");

  // Batch 16: the entry runs eagerly, and its callee `encoder` (captured only
  // at batch 8, not flagged) refuses the call, naming itself.
  ReferenceCall wide = Reference("nested", "wide_k1");
  absl::StatusOr<CallResult> result = model->Call(wide.args);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              AllOf(HasSubstr("no captured variant matches this call of frame 'encoder'"),
                    HasSubstr("x.size(0): expected 8, got 16")));
  EXPECT_EQ(Calls(*model, "encoder", Outcome::kRefused), 1u);
  EXPECT_EQ(Calls(*model, "forward", Outcome::kRefused), 1u);
}

const FrameMisses* MissesOf(const std::vector<FrameMisses>& misses, const LoadedVersion& model,
                            const std::string& frame) {
  for (const FrameMisses& m : misses) {
    if (model.manifest().frames(m.frame_index).name() == frame) return &m;
  }
  return nullptr;
}

TEST(LoadedVersion, RecordsEachFramesMissedCallsByWhatItsGuardsRead) {
  auto model = Load("nested");
  ASSERT_NE(model, nullptr);
  CallAndCompare(*model, "nested", "k0");
  EXPECT_TRUE(model->Misses().empty()) << "a variant hit is no miss";

  CallAndCompare(*model, "nested", "k1");
  CallAndCompare(*model, "nested", "k1");
  ReferenceCall wide = Reference("nested", "wide_k1");
  ASSERT_EQ(model->Call(wide.args).status().code(), absl::StatusCode::kFailedPrecondition);

  std::vector<FrameMisses> misses = model->Misses();
  const FrameMisses* forward = MissesOf(misses, *model, "forward");
  ASSERT_NE(forward, nullptr);
  ASSERT_EQ(forward->signatures.size(), 2u);
  const MissRecord& k1 = forward->signatures[0];
  EXPECT_EQ(k1.count, 2u);
  EXPECT_EQ(k1.outcome, Outcome::kEagerFallback);
  EXPECT_EQ(k1.explanation.closest_variant, "forward#0");
  EXPECT_THAT(k1.explanation.failing_guard, HasSubstr("k: expected 0, got 1"));
  ASSERT_EQ(k1.call.arguments_size(), 2);
  EXPECT_EQ(k1.call.arguments(0).name(), "x");
  EXPECT_THAT(k1.call.arguments(0).tensor().shape(), ::testing::ElementsAre(8, 4));
  EXPECT_EQ(k1.call.arguments(1).scalar().int_value(), 1);
  EXPECT_THAT(forward->signatures[1].call.arguments(0).tensor().shape(),
              ::testing::ElementsAre(16, 4));

  // The callee that refused the wide call records its own miss, refused.
  const FrameMisses* encoder = MissesOf(misses, *model, "encoder");
  ASSERT_NE(encoder, nullptr);
  ASSERT_EQ(encoder->signatures.size(), 1u);
  EXPECT_EQ(encoder->signatures[0].outcome, Outcome::kRefused);
  EXPECT_THAT(encoder->signatures[0].explanation.failing_guard,
              HasSubstr("x.size(0): expected 8, got 16"));
  // wobble has no variant: every call is a miss, with nothing to be closest.
  const FrameMisses* wobble = MissesOf(misses, *model, "wobble");
  ASSERT_NE(wobble, nullptr);
  EXPECT_EQ(wobble->signatures[0].explanation.closest_variant, "");
}

TEST(LoadedVersion, KeepsAtMostTheConfiguredSignaturesPerFrame) {
  LoadOptions options;
  options.miss_signatures_per_frame = 2;
  auto model = LoadedVersion::Load(ExampleArtifact("mlp"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int64_t batch : {1, 1, 1, 0, 0}) {
    at::Tensor x = at::ones({batch, 4});
    ASSERT_FALSE((*model)->Call({{"x", AsTensorArg(x)}}).ok());
  }
  at::Tensor doubles = at::ones({8, 4}, at::kDouble);
  ASSERT_FALSE((*model)->Call({{"x", AsTensorArg(doubles)}}).ok());
  std::vector<FrameMisses> misses = (*model)->Misses();
  ASSERT_EQ(misses.size(), 1u);
  ASSERT_EQ(misses[0].signatures.size(), 2u);
  EXPECT_EQ(misses[0].signatures[0].count, 3u) << "the most frequent stays";
  EXPECT_EQ(misses[0].other_calls, 2u) << "the least frequent was evicted: batch 0, twice";

  options.miss_signatures_per_frame = 0;
  model = LoadedVersion::Load(ExampleArtifact("mlp"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_FALSE((*model)->Call({{"x", AsTensorArg(doubles)}}).ok());
  EXPECT_TRUE((*model)->Misses().empty());
}

TEST(LoadedVersion, LeavesArgumentsToTheirRecordedDefaults) {
  auto loop = Load("loop");
  ASSERT_NE(loop, nullptr);
  ReferenceCall n0 = Reference("loop", "n0");
  absl::StatusOr<CallResult> compiled = loop->Call({{"x", AsTensorArg(n0.tensors[0])}});
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  EXPECT_EQ(compiled->variant_id, "forward#0");
  EXPECT_TRUE(at::allclose(AsTensor(compiled->outputs[0]), n0.expected[0]));

  // A batch the variant does not cover runs eagerly, with n at its default 0.
  ReferenceCall wide = Reference("loop", "wide_n0");
  absl::StatusOr<CallResult> eager = loop->Call({{"x", AsTensorArg(wide.tensors[0])}});
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_EQ(eager->outcome, Outcome::kEagerFallback);
  EXPECT_TRUE(at::allclose(AsTensor(eager->outputs[0]), wide.expected[0]));
}

TEST(LoadedVersion, RejectsMalformedArgumentsWithoutChangingAnything) {
  auto model = Load("loop");
  ASSERT_NE(model, nullptr);
  at::Tensor x = at::ones({8, 4});
  struct Case {
    std::vector<NamedValue> args;
    std::string message;
  };
  TensorArg short_bytes = AsTensorArg(x);
  short_bytes.nbytes -= 4;
  TensorArg negative = AsTensorArg(x);
  negative.shape = {-8, -4};
  const std::vector<Case> cases = {
      {{{"x", AsTensorArg(x)}, {"m", int64_t{1}}}, "has no argument 'm'"},
      {{{"n", int64_t{1}}}, "missing argument 'x'"},
      {{{"x", int64_t{3}}}, "argument 'x' must be a tensor, got an int"},
      {{{"x", AsTensorArg(x)}, {"n", std::string("two")}}, "argument 'n' must be an int"},
      {{{"x", AsTensorArg(x)}, {"x", AsTensorArg(x)}}, "given more than once"},
      {{{"x", short_bytes}}, "has 124 bytes but its shape [8, 4] of float32 needs 128"},
      {{{"x", negative}}, "negative dimension"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<CallResult> result = model->Call(c.args);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(result.status().message(), HasSubstr(c.message));
  }
  for (const FrameCoverage& c : model->Coverage()) {
    for (uint64_t n : c.calls_by_outcome) EXPECT_EQ(n, 0u) << "no frame was called";
  }
  CallAndCompare(*model, "loop", "n0");
}

class RecordingObserver : public CallObserver {
 public:
  struct Event {
    std::string frame;
    bool is_entry;
    Outcome outcome;
    std::string variant;
  };
  void OnFrameCall(const FrameCallEvent& e) override {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back({std::string(e.frame), e.is_entry, e.outcome, std::string(e.variant_id)});
  }
  void OnEagerFallbackWarning(absl::string_view, absl::string_view frame,
                              absl::string_view) override {
    std::lock_guard<std::mutex> lock(mu);
    warnings.emplace_back(frame);
  }
  std::mutex mu;
  std::vector<Event> events;
  std::vector<std::string> warnings;
};

TEST(LoadedVersion, ReportsEveryFrameCallToItsObserver) {
  auto model = Load("nested");
  ASSERT_NE(model, nullptr);
  auto observer = std::make_shared<RecordingObserver>();
  model->SetObserver(observer);
  CallAndCompare(*model, "nested", "k0");
  CallAndCompare(*model, "nested", "k1");
  ASSERT_EQ(observer->events.size(), 5u);
  EXPECT_EQ(observer->events[0].frame, "forward");
  EXPECT_TRUE(observer->events[0].is_entry);
  EXPECT_EQ(observer->events[0].variant, "forward#0");
  // The eager entry reports after its callees, which ran inside it.
  EXPECT_EQ(observer->events[1].frame, "encoder");
  EXPECT_FALSE(observer->events[1].is_entry);
  EXPECT_EQ(observer->events[1].outcome, Outcome::kVariant);
  EXPECT_EQ(observer->events[2].frame, "wobble");
  EXPECT_EQ(observer->events[2].outcome, Outcome::kEagerFallback);
  EXPECT_EQ(observer->events[3].frame, "scale");
  EXPECT_EQ(observer->events[4].frame, "forward");
  EXPECT_EQ(observer->events[4].outcome, Outcome::kEagerFallback);
  EXPECT_EQ(observer->warnings, std::vector<std::string>{"forward"});
}

class ModelConcurrency : public ::testing::TestWithParam<int> {};

TEST_P(ModelConcurrency, ManyThreadsShareOneModel) {
  auto model = Load("loop");
  ASSERT_NE(model, nullptr);
  const int threads = GetParam();
  constexpr int kCallsPerThread = 20;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        CallAndCompare(*model, "loop", (i + t) % 2 == 0 ? "n0" : "n1");
      }
    });
  }
  for (auto& w : workers) w.join();
  const uint64_t total = static_cast<uint64_t>(threads) * kCallsPerThread;
  EXPECT_EQ(Calls(*model, "forward", Outcome::kVariant) +
                Calls(*model, "forward", Outcome::kEagerFallback),
            total);
  EXPECT_EQ(model->Warnings().size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Threads, ModelConcurrency, ::testing::Values(1, 4, 16));

// A freshly loaded variant's first calls, more at once than it has runners:
// the burst a server sees right after a model loads. Each round loads anew,
// because only a variant's first run is at stake.
TEST(LoadedVersion, AFreshVariantsFirstCallsFromMoreThreadsThanRunnersAllFinish) {
  constexpr int kRounds = 20;
  constexpr int kThreads = 6;
  ReferenceCall ref = Reference("mlp", "batch8");
  LoadOptions options;
  options.runners_per_variant = 1;
  for (int round = 0; round < kRounds; ++round) {
    absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
        LoadedVersion::Load(ExampleArtifact("mlp"), options);
    ASSERT_TRUE(model.ok()) << model.status();
    std::atomic<int> ready{0};
    std::atomic<int> served{0};
    std::atomic<int> finished{0};
    Notification all_done;
    std::vector<std::thread> callers;
    for (int t = 0; t < kThreads; ++t) {
      callers.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() < kThreads) {
        }
        if ((*model)->Call(ref.args).ok()) served.fetch_add(1);
        if (finished.fetch_add(1) + 1 == kThreads) all_done.Notify();
      });
    }
    if (!all_done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
      // The callers are stuck for good: nothing can join them.
      ADD_FAILURE() << "round " << round << ": " << finished.load() << " of " << kThreads
                    << " first calls finished within 20 s; the others never return";
      std::_Exit(1);
    }
    for (std::thread& caller : callers) caller.join();
    EXPECT_EQ(served.load(), kThreads) << "round " << round;
  }
}

// Holds the first frame call inside the model until released.
class BlockingObserver : public CallObserver {
 public:
  void OnFrameCall(const FrameCallEvent&) override {
    if (!entered.HasBeenNotified()) {
      entered.Notify();
      release.WaitForNotification();
    }
  }
  void OnEagerFallbackWarning(absl::string_view, absl::string_view,
                              absl::string_view) override {}
  Notification entered;
  Notification release;
};

TEST(LoadedVersion, ACallInFlightFinishesAfterCloseAndNewCallsAreRefused) {
  auto model = Load("mlp");
  ASSERT_NE(model, nullptr);
  auto observer = std::make_shared<BlockingObserver>();
  model->SetObserver(observer);
  absl::StatusOr<CallResult> in_flight;
  ReferenceCall ref = Reference("mlp", "batch8");
  std::thread caller([&] { in_flight = model->Call(ref.args); });
  observer->entered.WaitForNotification();
  EXPECT_EQ(model->calls_in_flight(), 1);

  model->Close();
  absl::StatusOr<CallResult> late = model->Call(ref.args);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.status().message(), HasSubstr("model 'mlp' is unloaded"));
  EXPECT_FALSE(model->AwaitIdle(absl::Milliseconds(50)));

  observer->release.Notify();
  caller.join();
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  EXPECT_TRUE(at::allclose(AsTensor(in_flight->outputs[0]), ref.expected[0], 1e-4, 1e-5));
  EXPECT_TRUE(model->AwaitIdle(absl::Seconds(5)));
}

TEST(LoadedVersion, OutputsOutliveTheModelAndTheRequest) {
  std::vector<OutputTensor> outputs;
  at::Tensor expected;
  {
    auto model = Load("mlp");
    ASSERT_NE(model, nullptr);
    ReferenceCall ref = Reference("mlp", "batch8");
    absl::StatusOr<CallResult> result = model->Call(ref.args);
    ASSERT_TRUE(result.ok());
    outputs = result->outputs;
    expected = ref.expected[0].clone();
  }
  EXPECT_TRUE(at::allclose(AsTensor(outputs[0]), expected, 1e-4, 1e-5));
}

TEST(LoadedVersion, RefusesAnIncompleteArtifactOnlyWhenCompletenessIsRequired) {
  LoadOptions options;
  options.require_complete = true;
  // Every example is complete: flagged frames do not make a capture incomplete.
  for (const char* example : {"mlp", "loop", "branch", "nested", "passthrough"}) {
    absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
        LoadedVersion::Load(ExampleArtifact(example), options);
    EXPECT_TRUE(model.ok()) << example << ": " << model.status();
  }
  const std::string incomplete = testing::NewTempDirectory("incomplete");
  testing::CopyTree(ExampleArtifact("nested"), incomplete);
  testing::MarkIncomplete(incomplete, "wobble");
  absl::StatusOr<std::shared_ptr<LoadedVersion>> refused = LoadedVersion::Load(incomplete, options);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "model 'nested': the capture is incomplete (uncovered frames: [wobble], truncated by "
            "the recompile limit) and complete artifacts are required");
  options.require_complete = false;
  absl::StatusOr<std::shared_ptr<LoadedVersion>> loaded = LoadedVersion::Load(incomplete, options);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
}

TEST(LoadedVersion, RefusesAnArtifactForAnotherDevice) {
  LoadOptions options;
  options.device = DeviceType::kCuda;
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      LoadedVersion::Load(ExampleArtifact("mlp"), options);
  ASSERT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(model.status().message(),
              AllOf(HasSubstr("captured for cpu"), HasSubstr("runs models on cuda")));
}

}  // namespace
}  // namespace precompile
