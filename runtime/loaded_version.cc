#include "runtime/loaded_version.h"

#include <ATen/Context.h>
#include <ATen/ops/ones.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log_text.h"
#include "base/status_macros.h"
#include "runtime/artifact_reader.h"
#include "runtime/call_binding.h"
#include "runtime/cuda_support.h"
#include "runtime/device_health.h"
#include "runtime/eager_program.h"
#include "runtime/frame_caller.h"
#include "runtime/frame_dispatcher.h"
#include "runtime/inference_memory.h"
#include "runtime/kernel_input_checks.h"
#include "runtime/loaded_frame.h"
#include "runtime/miss_log.h"
#include "runtime/operators.h"
#include "runtime/size_program.h"
#include "runtime/torch_dtype.h"
#include "runtime/torch_errors.h"
#include "runtime/torch_threads.h"
#include "runtime/variant.h"

namespace precompile {
namespace {

using artifact::v1::Frame;

// Frames calling frames through eager programs: deeper than this is a cycle.
constexpr int kMaxFrameDepth = 32;

absl::string_view CauseWords(artifact::v1::FallbackCause cause) {
  switch (cause) {
    case artifact::v1::GRAPH_BREAK: return "a graph break Dynamo cannot resume from";
    case artifact::v1::GENERATOR: return "a generator, which Dynamo refuses to trace";
    case artifact::v1::USER_ERROR: return "a UserError Dynamo suppressed";
    case artifact::v1::BACKEND_SKIP: return "the backend declined the graph (SkipFrame)";
    case artifact::v1::SKIP_FRAME: return "a torch._dynamo.skip_frame() call";
    default: return "Dynamo gave up on it";
  }
}

// After a call on CUDA failed inside torch (INTERNAL): whether the device
// still works. A sticky error fails this probe too, and every later call.
void ProbeDeviceAfterFailure(DeviceType device, int index, const absl::Status& failure) {
  if (device != DeviceType::kCuda || failure.code() != absl::StatusCode::kInternal ||
      DeviceLostReason()) {
    return;
  }
  const absl::Status probe = CallTorch("then probing the CUDA device", [index] {
    const at::Device cuda(at::kCUDA, static_cast<c10::DeviceIndex>(index));
    at::ones({1}, at::TensorOptions().device(cuda)).sum().item<float>();
  });
  if (!probe.ok()) ReportDeviceLost(absl::StrCat(failure.message(), "; ", probe.message()));
}

// A variant's failed run, said as the client's doing where a kernel's input
// check refused what it sent, or where the variant checks as it runs what its
// guards do not ensure (artifact Variant.index_checks: indices from the
// inputs' values): such a check fails the run, as compiled code cannot refuse
// a call before.
// On CUDA the device is probed first: a device that no longer works is the
// failure to report, whatever the call sent.
absl::Status ExplainFailedRun(const artifact::v1::Variant& variant, DeviceType device,
                              int device_index, absl::Status failure) {
  // A kernel's input check, which runs on the host before the kernel does.
  failure = KernelRefusalAsInvalidArgument(std::move(failure));
  if (variant.index_checks().empty() || failure.code() != absl::StatusCode::kInternal) {
    return failure;
  }
  ProbeDeviceAfterFailure(device, device_index, failure);
  if (DeviceLostReason()) return failure;
  return absl::InvalidArgumentError(absl::StrCat(
      "variant ", variant.id(),
      " failed as it ran; it checks, as it runs, what its guards do not ensure of the inputs (",
      absl::StrJoin(variant.index_checks(), "; "), "), and this call may not meet those checks (",
      failure.message(), ")"));
}

}  // namespace

class LoadedVersion::Impl final : public FrameCaller {
 public:
  struct FrameResult {
    std::vector<at::Tensor> outputs;
    Outcome outcome = Outcome::kVariant;
    const std::string* variant_id = nullptr;
    bool eager_deferred = false;
    bool no_variant = false;
  };

  Artifact artifact;
  LoadOptions options;
  std::shared_ptr<CallObserver> observer;
  DeviceType device = DeviceType::kCpu;
  std::vector<std::unique_ptr<LoadedFrame>> frames;
  absl::flat_hash_map<std::string, LoadedFrame*> frames_by_name;
  std::unique_ptr<MissLog> misses;
  LoadedFrame* entry = nullptr;

  // Calls enter and leave with atomic operations only; `mu` and `idle` are
  // for AwaitIdle's waiters (counted in `idle_waiters`, so that the last call
  // out takes the lock only when someone waits) and for the warnings.
  // std::mutex, not absl::Mutex: see base/notification.h.
  mutable std::mutex mu;
  std::condition_variable idle;
  std::atomic<bool> closed{false};
  std::atomic<int> in_flight{0};
  std::atomic<int> idle_waiters{0};
  std::vector<EagerFallbackWarning> warnings ABSL_GUARDED_BY(mu);

  void LeaveCall() {
    if (in_flight.fetch_sub(1) == 1 && idle_waiters.load() > 0) {
      std::lock_guard<std::mutex> lock(mu);
      idle.notify_all();
    }
  }

  absl::Status LoadFrames();

  // Runs `frame` on positional `args` (one per parameter).
  absl::StatusOr<FrameResult> Dispatch(LoadedFrame& frame,
                                       std::vector<c10::IValue> args,
                                       bool is_entry);

  // The running call's context (cancellation, deferred misses), for the
  // frames it calls; set on whichever thread runs them.
  static thread_local const CallContext* context;

  absl::StatusOr<std::vector<at::Tensor>> CallFrame(
      absl::string_view name, std::vector<c10::IValue> args) override;
  const std::function<bool()>* Cancellation() override {
    return context != nullptr && context->cancelled ? &context->cancelled : nullptr;
  }
  bool Cancelled() {
    const std::function<bool()>* cancelled = Cancellation();
    return cancelled != nullptr && (*cancelled)();
  }

 private:
  // The frame's outputs among `leaves`, one value per leaf of its outputs.
  template <typename LeafValue>
  absl::StatusOr<std::vector<at::Tensor>> TensorLeaves(
      const LoadedFrame& frame, absl::string_view what,
      std::vector<LeafValue> leaves) const;
  absl::Status Views(const LoadedFrame& frame,
                     const std::vector<c10::IValue>& args,
                     absl::InlinedVector<ArgView, 8>& views) const;
  // INVALID_ARGUMENT when an output of variant `hit` for these arguments
  // would be larger than options.max_output_bytes (0: no limit), so that a
  // request cannot make the model compute what no response could carry.
  absl::Status CheckOutputSizes(const LoadedFrame& frame, int hit,
                                absl::Span<const ArgView> views) const;
  std::string Refusal(const LoadedFrame& frame, const MissExplanation& why,
                      absl::Span<const ArgView> views) const;
  MissExplanation Explain(const LoadedFrame& frame, absl::Span<const ArgView> views,
                          const GlobalState& state) const;
  // `explain` gives the miss's explanation, computed at most once per miss.
  void WarnEagerMiss(LoadedFrame& frame,
                     absl::FunctionRef<const MissExplanation&()> explain);
  void Report(LoadedFrame& frame, bool is_entry, Outcome outcome,
              int variant, absl::Duration dispatch, absl::Duration run,
              size_t miss_signatures = 0);
};

thread_local const LoadedVersion::CallContext* LoadedVersion::Impl::context = nullptr;

absl::Status LoadedVersion::Impl::LoadFrames() {
  const auto& m = artifact.manifest;
  for (const Frame& proto : m.frames()) {
    ASSIGN_OR_RETURN(std::unique_ptr<LoadedFrame> frame,
                     LoadFrame(artifact, proto, static_cast<int>(frames.size()), device, options));
    frames_by_name[proto.name()] = frame.get();
    if (proto.name() == m.entry_frame()) entry = frame.get();
    frames.push_back(std::move(frame));
  }
  std::vector<std::vector<std::string>> names;
  for (const auto& frame : frames) names.push_back(frame->parameter_names);
  misses = std::make_unique<MissLog>(std::move(names), options.miss_signatures_per_frame);
  return absl::OkStatus();
}

namespace {
bool IsTensor(const at::Tensor& t) { return t.defined(); }
bool IsTensor(const c10::IValue& v) { return v.isTensor(); }
at::Tensor TakeTensor(at::Tensor& t) { return std::move(t); }
at::Tensor TakeTensor(c10::IValue& v) { return std::move(v).toTensor(); }
}  // namespace

template <typename LeafValue>
absl::StatusOr<std::vector<at::Tensor>> LoadedVersion::Impl::TensorLeaves(
    const LoadedFrame& frame, absl::string_view what,
    std::vector<LeafValue> leaves) const {
  const auto& schema = frame.proto->outputs().leaves();
  if (leaves.size() != static_cast<size_t>(schema.size())) {
    return absl::InternalError(absl::StrCat(
        what, " of frame '", frame.proto->name(), "' returned ", leaves.size(),
        " values, but the frame returns ", schema.size(), " (its output leaves)"));
  }
  std::vector<at::Tensor> tensors;
  tensors.reserve(frame.tensor_leaves.size());
  for (int i : frame.tensor_leaves) {
    if (!IsTensor(leaves[i])) {
      return absl::InternalError(absl::StrCat(
          what, " of frame '", frame.proto->name(), "' returned no tensor for output '",
          schema[i].name(), "'"));
    }
    tensors.push_back(TakeTensor(leaves[i]));
  }
  return tensors;
}

absl::Status LoadedVersion::Impl::CheckOutputSizes(const LoadedFrame& frame, int hit,
                                                   absl::Span<const ArgView> views) const {
  if (options.max_output_bytes == 0) return absl::OkStatus();
  const auto& variant = frame.proto->variants(hit);
  const auto& sources = frame.symbol_sources[hit];
  for (int i = 0; i < variant.outputs_size(); ++i) {
    const artifact::v1::TensorSpec& spec = variant.outputs(i);
    std::optional<DType> dtype = DTypeFromProto(spec.dtype());
    // Older artifacts say nothing of their dynamic dimensions.
    if (!dtype || spec.shape_symbols_size() != spec.shape_size()) continue;
    // A size symbol's value for these arguments, read off the argument and
    // dimension that bind it in the variant's guards.
    auto symbol_value = [&](int32_t symbol) -> std::optional<int64_t> {
      auto source = sources.find(static_cast<uint32_t>(symbol));
      if (source == sources.end()) return std::nullopt;
      const auto [parameter, dim, offset] = source->second;
      if (parameter >= static_cast<int>(views.size()) ||
          views[parameter].kind != ArgView::Kind::kTensor) {
        return std::nullopt;
      }
      // The guards held: the size minus its offset is the symbol, in range.
      return views[parameter].sizes[dim] - offset;
    };
    // Dimension d's size for these arguments.
    auto size_of = [&](int d) -> SizeValue {
      if (spec.shape(d) >= 0) return {SizeValue::Kind::kKnown, spec.shape(d)};
      if (spec.shape_symbols(d) >= 0) {
        const std::optional<int64_t> v = symbol_value(spec.shape_symbols(d));
        return v ? SizeValue{SizeValue::Kind::kKnown, *v} : SizeValue{};
      }
      if (d < spec.shape_programs_size()) {
        return EvaluateSize(spec.shape_programs(d), symbol_value);
      }
      return {};
    };
    // Saturates instead of wrapping: at 2^63 the output is past any limit.
    constexpr unsigned __int128 kSaturated = uint64_t{1} << 63;
    unsigned __int128 bytes = DTypeSize(*dtype);
    for (int d = 0; d < spec.shape_size(); ++d) {
      const SizeValue size = size_of(d);
      if (size.kind == SizeValue::Kind::kUnknown) {
        bytes = 0;  // Not known: not checked.
        break;
      }
      const unsigned __int128 factor =
          size.kind == SizeValue::Kind::kOverflow ? kSaturated : static_cast<uint64_t>(size.value);
      bytes = std::min<unsigned __int128>(bytes * factor, kSaturated);
    }
    if (bytes <= options.max_output_bytes) continue;
    std::vector<std::string> shape;
    for (int d = 0; d < spec.shape_size(); ++d) {
      const SizeValue size = size_of(d);
      shape.push_back(size.kind == SizeValue::Kind::kKnown ? absl::StrCat(size.value)
                                                           : std::string("more than 2^63"));
    }
    const int leaf = i < static_cast<int>(frame.tensor_leaves.size()) ? frame.tensor_leaves[i] : -1;
    const std::string name =
        leaf >= 0 ? frame.proto->outputs().leaves(leaf).name() : absl::StrCat("output", i);
    return absl::InvalidArgumentError(absl::StrCat(
        "output '", name, "' of this call would be ", DTypeName(*dtype), "[",
        absl::StrJoin(shape, ", "), "], ",
        bytes >= kSaturated ? std::string("2^63 or more") : absl::StrCat(static_cast<uint64_t>(bytes)),
        " bytes: more than the ", options.max_output_bytes,
        " bytes a response may carry (--max_message_bytes); ask for smaller inputs"));
  }
  return absl::OkStatus();
}

absl::Status LoadedVersion::Impl::Views(const LoadedFrame& frame,
                                const std::vector<c10::IValue>& args,
                                absl::InlinedVector<ArgView, 8>& views) const {
  views.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    ArgView& v = views[i];
    if (a.isNone()) {
      v.kind = ArgView::Kind::kNone;
    } else if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();
      std::optional<DType> dtype = FromScalarType(t.scalar_type());
      if (!dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            "argument '", frame.parameter_names[i], "' of frame '",
            frame.proto->name(), "' has dtype ", c10::toString(t.scalar_type()),
            ", which this runtime does not serve"));
      }
      v.kind = ArgView::Kind::kTensor;
      v.dtype = *dtype;
      v.device = t.is_cuda() ? DeviceType::kCuda : DeviceType::kCpu;
      v.rank = static_cast<int32_t>(t.dim());
      v.sizes = t.sizes().data();
    } else if (a.isBool()) {
      v.kind = ArgView::Kind::kBool;
      v.bool_value = a.toBool();
    } else if (a.isInt()) {
      v.kind = ArgView::Kind::kInt;
      v.int_value = a.toInt();
    } else if (a.isDouble()) {
      v.kind = ArgView::Kind::kFloat;
      v.float_value = a.toDouble();
    } else if (a.isString()) {
      v.kind = ArgView::Kind::kString;
      v.string_value = absl::string_view(a.toStringRef());
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument '", frame.parameter_names[i], "' of frame '",
          frame.proto->name(), "' is a ", a.tagKind(),
          ", which frames do not take"));
    }
  }
  return absl::OkStatus();
}

MissExplanation LoadedVersion::Impl::Explain(const LoadedFrame& frame,
                                             absl::Span<const ArgView> views,
                                             const GlobalState& state) const {
  std::optional<FrameDispatcher::Explanation> why =
      frame.dispatcher->ExplainMiss(views, state);
  if (!why) return {};
  return {frame.proto->variants(why->variant).id(), std::move(why->reason)};
}

namespace {

// A call's first size past the frame's limits (the capture's --max-size),
// in words: no variant takes it, nor will a recapture compile one, which a
// guard's own words cannot say. A dimension's own limit overrides its
// tensor's every-dimension one, as the capture applies them.
std::optional<std::string> PastSizeLimit(const LoadedFrame& frame,
                                         absl::Span<const ArgView> views) {
  const auto& names = frame.parameter_names;
  for (size_t p = 0; p < names.size(); ++p) {
    const ArgView& arg = views[p];
    if (arg.kind != ArgView::Kind::kTensor) continue;
    for (int d = 0; d < arg.rank; ++d) {
      const artifact::v1::SizeLimit* applies = nullptr;
      for (const artifact::v1::SizeLimit& limit : frame.proto->size_limits()) {
        if (limit.parameter() != names[p]) continue;
        if (limit.has_dim() && limit.dim() == d) {
          applies = &limit;
          break;
        }
        if (!limit.has_dim() && applies == nullptr) applies = &limit;
      }
      if (applies != nullptr && arg.sizes[d] > applies->max()) {
        return absl::StrCat(names[p], ".size(", d, ") is ", arg.sizes[d], ", more than the ",
                            applies->max(), " the model was captured to take at most (--max-size)");
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::string LoadedVersion::Impl::Refusal(const LoadedFrame& frame, const MissExplanation& why,
                                         absl::Span<const ArgView> views) const {
  std::string message = absl::StrCat(
      "no captured variant matches this call of frame '", frame.proto->name(),
      "' (model '", options.name, "')");
  if (std::optional<std::string> past = PastSizeLimit(frame, views)) {
    absl::StrAppend(&message, ": ", *past);
  } else if (!why.closest_variant.empty()) {
    absl::StrAppend(&message, ": closest variant ", why.closest_variant, ": ",
                    why.failing_guard);
  } else {
    absl::StrAppend(&message, ": the capture compiled no variant of this frame");
  }
  return message;
}

void LoadedVersion::Impl::WarnEagerMiss(
    LoadedFrame& frame, absl::FunctionRef<const MissExplanation&()> explain) {
  if (frame.warned.exchange(true, std::memory_order_relaxed)) return;
  const Frame& f = *frame.proto;
  std::string closest;
  if (const MissExplanation& why = explain(); !why.closest_variant.empty()) {
    closest = absl::StrCat(" (closest variant ", why.closest_variant, ": ",
                           why.failing_guard, ")");
  }
  std::string message = absl::StrCat(
      "model '", options.name, "': frame '", f.name(),
      "' runs eagerly: no captured variant matches this call", closest,
      ". The frame is flagged eager_fallback because Dynamo gave up on it "
      "during the capture (", CauseWords(f.fallback_cause()), "), so every such "
      "miss runs its eager program; only this frame runs eagerly, the frames it "
      "calls still use their own variants. To get such calls compiled, "
      "recapture with an example call that covers them, or fix what made "
      "Dynamo give up (TORCH_LOGS=graph_breaks shows it). Recompile logs "
      "(TORCH_LOGS=recompiles) will not report this miss. Logged once per "
      "frame; later eager misses are only counted.");
  spdlog::warn("event=eager_fallback model={} frame={} message=\"{}\"", options.name, f.name(),
               message);
  {
    std::lock_guard<std::mutex> lock(mu);
    warnings.push_back({f.name(), message, absl::Now()});
  }
  if (observer) {
    observer->OnEagerFallbackWarning(options.name, f.name(), message);
  }
}

void LoadedVersion::Impl::Report(LoadedFrame& frame, bool is_entry, Outcome outcome,
                         int variant, absl::Duration dispatch,
                         absl::Duration run, size_t miss_signatures) {
  frame.calls[static_cast<int>(outcome)].fetch_add(1, std::memory_order_relaxed);
  if (variant >= 0) frame.hits[variant].fetch_add(1, std::memory_order_relaxed);
  std::vector<FrameCallEvent>* traced = context != nullptr ? context->frame_calls : nullptr;
  if (!observer && traced == nullptr) return;
  FrameCallEvent event;
  event.model = options.name;
  event.frame = frame.proto->name();
  event.frame_index = frame.index;
  event.variant_index = variant;
  event.is_entry = is_entry;
  event.outcome = outcome;
  if (variant >= 0) event.variant_id = frame.proto->variants(variant).id();
  event.dispatch_time = dispatch;
  event.run_time = run;
  event.miss_signatures = miss_signatures;
  if (observer) observer->OnFrameCall(event);
  if (traced != nullptr) traced->push_back(std::move(event));
}

absl::StatusOr<LoadedVersion::Impl::FrameResult> LoadedVersion::Impl::Dispatch(
    LoadedFrame& frame, std::vector<c10::IValue> args, bool is_entry) {
  thread_local int depth = 0;
  if (depth >= kMaxFrameDepth) {
    return absl::FailedPreconditionError(absl::StrCat(
        "frame '", frame.proto->name(), "' is nested more than ",
        kMaxFrameDepth, " frames deep"));
  }
  struct DepthScope {
    DepthScope() { ++depth; }
    ~DepthScope() { --depth; }
  } depth_scope;

  if (Cancelled()) {
    return absl::CancelledError(absl::StrCat(
        "the call was cancelled before frame '", frame.proto->name(), "' ran"));
  }
  const absl::Time start = absl::Now();
  absl::InlinedVector<ArgView, 8> views;
  if (absl::Status s = Views(frame, args, views); !s.ok()) {
    Report(frame, is_entry, Outcome::kError, -1, absl::Now() - start, {});
    return s;
  }
  std::optional<DType> default_dtype = FromScalarType(c10::get_default_dtype_as_scalartype());
  const GlobalState state{c10::GradMode::is_enabled(),
                          default_dtype.value_or(DType::kFloat32)};
  const int hit = frame.dispatcher->Match(views, state);

  if (is_entry && hit >= 0 && context != nullptr && context->match_only) {
    return FrameResult{{}, Outcome::kVariant, &frame.proto->variants(hit).id()};
  }
  if (hit >= 0) {
    absl::Status checked = is_entry ? CheckOutputSizes(frame, hit, views)
                                    : CheckIndexRanges(*frame.proto, args);
    if (!checked.ok()) {
      Report(frame, is_entry, Outcome::kError, -1, absl::Now() - start, {});
      return checked;
    }
    const absl::Time matched = absl::Now();
    const auto& v = frame.proto->variants(hit);
    std::vector<at::Tensor> inputs;
    inputs.reserve(v.tensor_inputs_size());
    for (uint32_t p : v.tensor_inputs()) inputs.push_back(args[p].toTensor());
    absl::StatusOr<std::vector<at::Tensor>> out =
        frame.variants[hit]->Run(std::move(inputs));
    if (out.ok()) {
      out = TensorLeaves(frame, absl::StrCat("variant ", v.id()), *std::move(out));
    } else {
      out = ExplainFailedRun(v, device, options.cuda_device_index, out.status());
    }
    const absl::Time done = absl::Now();
    if (!out.ok()) {
      Report(frame, is_entry, Outcome::kError, -1, matched - start, done - matched);
      return out.status();
    }
    Report(frame, is_entry, Outcome::kVariant, hit, matched - start, done - matched);
    return FrameResult{*std::move(out), Outcome::kVariant, &v.id()};
  }

  if (is_entry && context != nullptr && (context->variant_only || context->match_only)) {
    return FrameResult{{}, Outcome::kRefused, nullptr, false, /*no_variant=*/true};
  }
  if (!frame.proto->eager_fallback()) {
    const MissExplanation why = Explain(frame, views, state);
    absl::Status refusal = absl::FailedPreconditionError(Refusal(frame, why, views));
    const absl::Time refused = absl::Now();
    const size_t signatures = misses->Record(
        frame.index, views, Outcome::kRefused, [&] { return why; }, refused);
    Report(frame, is_entry, Outcome::kRefused, -1, refused - start, {}, signatures);
    return refusal;
  }

  if (is_entry && context != nullptr && context->defer_entry_eager) {
    return FrameResult{{}, Outcome::kEagerFallback, nullptr, /*eager_deferred=*/true};
  }

  // The frame's first warning and a new miss signature both want the
  // closest variant; the first miss of a frame is usually both.
  std::optional<MissExplanation> why;
  auto explain = [&]() -> const MissExplanation& {
    if (!why) why = Explain(frame, views, state);
    return *why;
  };
  if (!frame.variants.empty()) WarnEagerMiss(frame, explain);
  const absl::Time matched = absl::Now();
  const size_t signatures = misses->Record(
      frame.index, views, Outcome::kEagerFallback, [&] { return explain(); }, matched);
  if (device == DeviceType::kCuda) {
    absl::Status moved = CallTorch("moving arguments to the GPU", [&] {
      for (c10::IValue& a : args) {
        if (a.isTensor() && !a.toTensor().is_cuda()) a = a.toTensor().to(at::kCUDA);
      }
    });
    if (!moved.ok()) return moved;
  }
  absl::StatusOr<std::vector<c10::IValue>> leaves;
  {
    ScopedFrameCaller scope(this);
    leaves = frame.eager->Run(std::move(args));
  }
  absl::StatusOr<std::vector<at::Tensor>> out =
      leaves.ok() ? TensorLeaves(frame, "the eager program", *std::move(leaves))
                  : absl::StatusOr<std::vector<at::Tensor>>(leaves.status());
  const absl::Time done = absl::Now();
  if (!out.ok()) {
    // A kernel's input check failed on what the client sent.
    out = KernelRefusalAsInvalidArgument(out.status());
    // A callee's refusal refuses the call; anything else is an error.
    Outcome outcome = out.status().code() == absl::StatusCode::kFailedPrecondition
                          ? Outcome::kRefused
                          : Outcome::kError;
    Report(frame, is_entry, outcome, -1, matched - start, done - matched, signatures);
    return out.status();
  }
  Report(frame, is_entry, Outcome::kEagerFallback, -1, matched - start,
         done - matched, signatures);
  return FrameResult{*std::move(out), Outcome::kEagerFallback, nullptr};
}

absl::StatusOr<std::vector<at::Tensor>> LoadedVersion::Impl::CallFrame(
    absl::string_view name, std::vector<c10::IValue> args) {
  auto it = frames_by_name.find(name);
  if (it == frames_by_name.end()) {
    return absl::InternalError(absl::StrCat(
        "an eager program called frame '", name,
        "', which the artifact does not have"));
  }
  LoadedFrame& frame = *it->second;
  const auto& params = frame.proto->parameters();
  if (args.size() > static_cast<size_t>(params.size())) {
    return absl::InternalError(absl::StrCat(
        "frame '", name, "' takes ", params.size(), " arguments, called with ",
        args.size()));
  }
  for (int i = static_cast<int>(args.size()); i < params.size(); ++i) {
    if (!params[i].has_default_value()) {
      return absl::InternalError(absl::StrCat(
          "frame '", name, "' was called without argument '", params[i].name(), "'"));
    }
    args.push_back(ScalarToIValue(params[i].default_value()));
  }
  ASSIGN_OR_RETURN(FrameResult result, Dispatch(frame, std::move(args), false));
  return std::move(result.outputs);
}

LoadedVersion::LoadedVersion(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LoadedVersion::~LoadedVersion() = default;

absl::StatusOr<std::shared_ptr<LoadedVersion>> LoadedVersion::Load(const std::string& directory,
                                                   LoadOptions options) {
  ArtifactReaderOptions reader_options;
  reader_options.torch_version = TORCH_VERSION;
  ASSIGN_OR_RETURN(Artifact artifact, ReadArtifact(directory, reader_options));
  auto impl = std::make_unique<Impl>();
  impl->artifact = std::move(artifact);
  const auto& m = impl->artifact.manifest;
  if (options.name.empty()) options.name = m.model_name();
  impl->options = std::move(options);
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("model '", impl->options.name,
                                               "': ", s.message()));
  };
  // Eager programs, and operators defined in Python that compiled code
  // calls, run ATen's kernels on what clients send.
  if (absl::Status checks = InstallKernelInputChecks(); !checks.ok()) return fail(checks);
  if (impl->options.require_complete && !m.summary().complete()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "the capture is incomplete (uncovered frames: [",
        absl::StrJoin(m.summary().uncovered_frames(), ", "), "]",
        m.summary().truncated() ? ", truncated by the recompile limit" : "",
        ") and complete artifacts are required")));
  }
  if (impl->options.device &&
      DeviceTypeName(*impl->options.device) != m.device()) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "the artifact was captured for ", m.device(), " but this server runs models on ",
        DeviceTypeName(*impl->options.device), "; recapture it with device=\"",
        DeviceTypeName(*impl->options.device), "\"")));
  }
  if (m.device() == "cuda") {
    impl->device = DeviceType::kCuda;
    if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          "the artifact was compiled for CUDA but CUDA is not usable here: ",
          cuda.message())));
    }
    if (impl->options.cuda_pinned_staging) {
      if (absl::Status pinned = CheckPinnedMemory(); !pinned.ok()) {
        // Copies from pageable memory are slower, not wrong.
        spdlog::warn("event=cuda_pinned_staging_off model={} reason=\"{}\"", impl->options.name,
                     LoggedText(pinned.message(), 512));
        impl->options.cuda_pinned_staging = false;
      }
    }
  }
  if (absl::Status s = ProvideOperators(m, PythonSettingsOf(impl->options)); !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = impl->LoadFrames(); !s.ok()) return fail(s);
  // The loaders read the files through the descriptors checked; a write
  // since would mean something else was loaded.
  if (absl::Status s = impl->artifact.ReleaseFiles(); !s.ok()) return fail(s);
  spdlog::info("loaded model '{}' from {}: {} frames, entry '{}', complete={}",
               impl->options.name, impl->artifact.directory, m.frames_size(),
               m.entry_frame(), m.summary().complete());
  return std::shared_ptr<LoadedVersion>(new LoadedVersion(std::move(impl)));
}

absl::StatusOr<CallResult> LoadedVersion::Call(absl::Span<const NamedValue> args) {
  return Call(args, CallContext{});
}

absl::StatusOr<CallResult> LoadedVersion::Call(absl::Span<const NamedValue> args,
                                               const CallContext& call_context) {
  Impl& impl = *impl_;
  // Counted before `closed` is read, so that Close() followed by AwaitIdle()
  // either sees this call or this call sees `closed`.
  impl.in_flight.fetch_add(1);
  struct InFlight {
    Impl& impl;
    ~InFlight() { impl.LeaveCall(); }
  } in_flight{impl};
  if (impl.closed.load()) {
    return absl::UnavailableError(absl::StrCat("model '", impl.options.name, "' is unloaded"));
  }

  // Before the arguments go to the GPU: their copies are the call's too.
  std::unique_ptr<CudaCall> on_device;
  if (impl.device == DeviceType::kCuda) {
    ASSIGN_OR_RETURN(on_device, CudaCall::Enter(impl.options.cuda_device_index,
                                                impl.options.cuda_stream_per_call));
  }
  const CudaCopies copies =
      impl.options.cuda_pinned_staging ? CudaCopies::kPinned : CudaCopies::kPageable;
  ASSIGN_OR_RETURN(BoundArguments bound,
                   BindArguments(*impl.entry->proto, impl.options.name, args, impl.device, copies));

  const ChargedCall charged;
  UseTorchThreadsOnThisThread();
  c10::InferenceMode inference_mode;
  const CallContext* previous_context = Impl::context;
  Impl::context = &call_context;
  absl::StatusOr<Impl::FrameResult> dispatched =
      impl.Dispatch(*impl.entry, std::move(bound.positional), true);
  Impl::context = previous_context;
  if (!dispatched.ok()) {
    ProbeDeviceAfterFailure(impl.device, impl.options.cuda_device_index, dispatched.status());
    return charged.Explain(dispatched.status(), absl::StrCat("model '", impl.options.name, "'"));
  }
  Impl::FrameResult result = *std::move(dispatched);

  CallResult call_result;
  call_result.outcome = result.outcome;
  call_result.eager_deferred = result.eager_deferred;
  call_result.no_variant = result.no_variant;
  if (result.variant_id) call_result.variant_id = *result.variant_id;
  absl::StatusOr<std::vector<OutputTensor>> converted = HostOutputs(
      std::move(result.outputs), bound.request_tensors,
      impl.device == DeviceType::kCuda ? call_context.outputs_on_device : nullptr, copies);
  if (!converted.ok()) {
    // Copying a CUDA output to the host is where an asynchronous error shows.
    ProbeDeviceAfterFailure(impl.device, impl.options.cuda_device_index, converted.status());
    return charged.Explain(converted.status(), absl::StrCat("model '", impl.options.name, "'"));
  }
  call_result.outputs = *std::move(converted);
  return call_result;
}

void LoadedVersion::SetObserver(std::shared_ptr<CallObserver> observer) {
  impl_->observer = std::move(observer);
}

void LoadedVersion::Close() {
  if (!impl_->closed.exchange(true)) {
    spdlog::info("model '{}' closed; {} calls still running", impl_->options.name,
                 impl_->in_flight.load());
  }
}

bool LoadedVersion::AwaitIdle(absl::Duration timeout) {
  // Counted before in_flight is read (under the lock), so that the last call
  // out either is seen here or sees a waiter and notifies under the lock.
  impl_->idle_waiters.fetch_add(1);
  bool idle = false;
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    idle = impl_->idle.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                [this] { return impl_->in_flight.load() == 0; });
  }
  impl_->idle_waiters.fetch_sub(1);
  return idle;
}

int LoadedVersion::calls_in_flight() const { return impl_->in_flight.load(); }

const std::string& LoadedVersion::name() const { return impl_->options.name; }
const artifact::v1::Manifest& LoadedVersion::manifest() const {
  return impl_->artifact.manifest;
}
const artifact::v1::Frame& LoadedVersion::entry_frame() const {
  return *impl_->entry->proto;
}
const std::string& LoadedVersion::frames_text() const {
  return impl_->artifact.frames_text;
}

std::vector<FrameCoverage> LoadedVersion::Coverage() const {
  std::vector<FrameCoverage> coverage;
  for (const auto& frame : impl_->frames) {
    FrameCoverage c;
    c.frame = frame->proto->name();
    c.eager_fallback = frame->proto->eager_fallback();
    for (int i = 0; i < 4; ++i) {
      c.calls_by_outcome[i] = frame->calls[i].load(std::memory_order_relaxed);
    }
    for (int i = 0; i < frame->proto->variants_size(); ++i) {
      c.variant_hits.emplace_back(frame->proto->variants(i).id(),
                                  frame->hits[i].load(std::memory_order_relaxed));
    }
    coverage.push_back(std::move(c));
  }
  return coverage;
}

std::vector<FrameMisses> LoadedVersion::Misses() const { return impl_->misses->Snapshot(); }

int LoadedVersion::miss_signatures_per_frame() const {
  return impl_->misses->signatures_per_frame();
}

int LoadedVersion::runners_per_variant() const {
  return std::max(1, impl_->options.runners_per_variant);
}

std::vector<EagerFallbackWarning> LoadedVersion::Warnings() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->warnings;
}

}  // namespace precompile
