// One version of a model in memory: a loaded precompile artifact, callable
// from any thread. (A "model" is a name with versions; the server's
// repository maps each to the LoadedVersions it serves.)
//
// A call names the entry frame's arguments (tensors by parameter name, and
// non-tensor arguments as scalars); arguments left out take the defaults the
// capture recorded. The entry frame is then served as the artifact's
// semantics say:
//
//   - a variant whose guards hold runs its compiled code;
//   - otherwise, a frame flagged eager_fallback runs its eager program (the
//     frame's first such miss logs one warning; later ones are counted); the
//     frames it calls are dispatched in turn, each to its own variants;
//   - otherwise the call is refused: FAILED_PRECONDITION "no captured variant
//     matches this call", naming the frame and the closest variant's first
//     failing guard.
//
// A flagged frame with no variants is served eagerly from the start and warns
// nothing.
//
// This header is free of torch types on purpose: the server and clients
// compile without torch's headers.
//
// Thread safety: all methods may be called concurrently. Close() makes new
// calls fail while calls already running finish; the model's memory is freed
// when the last shared_ptr to it goes away.
#ifndef PRECOMPILE_RUNTIME_LOADED_VERSION_H_
#define PRECOMPILE_RUNTIME_LOADED_VERSION_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/artifact.pb.h"
#include "runtime/miss_log.h"
#include "runtime/observer.h"
#include "runtime/value.h"

namespace precompile {

struct LoadOptions {
  // The name the model is served under. Default: the artifact's model_name.
  std::string name;
  // Model instances per variant that can run at once. Default: 2.
  int runners_per_variant = 2;
  // The device type models run on: an artifact captured for another one is
  // refused. nullopt: whatever the artifact was captured for.
  std::optional<DeviceType> device;
  // CUDA device for a CUDA artifact; -1 for the current device.
  int cuda_device_index = -1;
  // Each call of a CUDA artifact on a stream of its own (CudaCall in
  // runtime/cuda_support.h), rather than all on the device's default
  // stream. Default: true.
  bool cuda_stream_per_call = true;
  // Request tensors go to a CUDA device, and outputs come back, through
  // pinned host buffers, with one wait for the stream per call
  // (CudaCopies::kPinned in runtime/call_binding.h). Default: true.
  bool cuda_pinned_staging = true;
  // Refuse an artifact whose summary is not complete (uncovered frames or a
  // truncated capture). Default: false (such artifacts load and refuse the
  // calls they do not cover).
  bool require_complete = false;
  // Distinct signatures of missed calls kept per frame (see MissLog); 0
  // records none.
  int miss_signatures_per_frame = 64;
  // A call whose entry variant's outputs would be larger than this many
  // bytes (known from the variant's size symbols before it runs) is refused
  // with INVALID_ARGUMENT naming the output; 0: no limit. A server sets it
  // to what a response may carry.
  uint64_t max_output_bytes = 0;
  // For artifacts with Python eager programs (runtime/python_program.h):
  // whether they may load at all (loading one runs the code it names;
  // default: false, and such artifacts are refused), the Python environment
  // and the plugin to run them with (empty for the defaults), and the
  // directories put first on the interpreter's sys.path. The first artifact
  // that starts Python fixes the environment and path for the process.
  bool allow_python_programs = false;
  std::string python_environment;
  std::string python_plugin;
  std::vector<std::string> python_path;
};

// Calls of one frame since the model was loaded.
struct FrameCoverage {
  std::string frame;
  bool eager_fallback = false;
  // Indexed by Outcome.
  std::array<uint64_t, 4> calls_by_outcome{};
  // Hits per variant, in the artifact's order.
  std::vector<std::pair<std::string, uint64_t>> variant_hits;
};

struct EagerFallbackWarning {
  std::string frame;
  std::string message;
  absl::Time time;
};

class LoadedVersion {
 public:
  // Validates and loads the artifact in `directory`: its manifest and
  // checksums (see ReadArtifact for those errors), every variant's compiled
  // package and every frame's eager program.
  // Errors, besides ReadArtifact's:
  //   FAILED_PRECONDITION  a CUDA artifact without a usable CUDA device; an
  //                        artifact for another device than options.device;
  //                        an incomplete artifact with require_complete
  //   INTERNAL             a package or eager program that libtorch refuses
  // Nothing of a failed load stays in memory.
  static absl::StatusOr<std::shared_ptr<LoadedVersion>> Load(const std::string& directory,
                                                     LoadOptions options);

  ~LoadedVersion();
  LoadedVersion(const LoadedVersion&) = delete;
  LoadedVersion& operator=(const LoadedVersion&) = delete;

  // Calls the entry frame. `args` name the parameters; each name at most once.
  // Tensor bytes must stay valid until Call returns.
  // Errors:
  //   INVALID_ARGUMENT     an unknown, repeated or missing argument, a value of
  //                        the wrong kind, or a tensor whose byte count does
  //                        not match its shape and dtype
  //   FAILED_PRECONDITION  no variant matches and the frame is not flagged
  //                        (also when a frame called by an eager program is
  //                        refused: the message names that frame)
  //   UNAVAILABLE          the model was closed
  //   CANCELLED            the caller cancelled it (see below)
  //   INTERNAL             the compiled code or eager program failed
  absl::StatusOr<CallResult> Call(absl::Span<const NamedValue> args);

  // How one call runs, for a caller that wants more than the defaults.
  struct CallContext {
    // Polled before each frame runs, including frames an eager program
    // calls, and at each iteration of a loop in a TorchScript eager program
    // (precompile::check_cancelled); a true answer ends the call with
    // CANCELLED. A compiled variant that has started runs to its end, and so
    // does a Python eager program between the frames it calls. Empty: never
    // cancelled.
    std::function<bool()> cancelled;
    // When set, a call whose entry frame no variant matches and whose eager
    // program would run returns without running it: CallResult::
    // eager_deferred, no outputs, nothing recorded (no miss, warning or
    // frame call). Calling again with the same arguments, unset, runs it.
    // A server moves misses to threads of their own this way
    // (server/scheduling/request_scheduler.h); the entry's guards are evaluated twice.
    bool defer_entry_eager = false;
    // When set, a call whose entry frame no variant matches returns without
    // running anything: CallResult::no_variant, no outputs, nothing recorded
    // (no miss, warning, refusal or frame call). A server tries a merged
    // batch of requests this way, and runs them one by one when it misses
    // (server/scheduling/dynamic_batching.h).
    bool variant_only = false;
    // When set, the call stops once the entry's guards are evaluated:
    // CallResult::variant_id names the variant that would run, or
    // no_variant is set; nothing runs and nothing is recorded.
    bool match_only = false;
    // When set, each frame call of this call (the entry's and those its
    // eager program makes) is appended as the observer sees it: where a
    // traced request's time went.
    std::vector<FrameCallEvent>* frame_calls = nullptr;
    // For a model on CUDA: the outputs (by index among the entry's tensor
    // outputs) to leave in device memory rather than copy to the host, for
    // a later call to take back as arguments (a sequence's state). Ignored
    // on the CPU. Null: every output to the host.
    const std::vector<bool>* outputs_on_device = nullptr;
  };
  absl::StatusOr<CallResult> Call(absl::Span<const NamedValue> args,
                                  const CallContext& context);

  // Sends every frame call and eager-fallback warning of this model to
  // `observer` (null: none). REQUIRES: no call has started yet, i.e. the
  // model has not been shared with calling threads.
  void SetObserver(std::shared_ptr<CallObserver> observer);

  // New calls fail with UNAVAILABLE from now on; running calls finish.
  void Close();
  // Waits until no call is running, at most `timeout`. True if idle.
  bool AwaitIdle(absl::Duration timeout);
  int calls_in_flight() const;

  const std::string& name() const;
  const artifact::v1::Manifest& manifest() const;
  const artifact::v1::Frame& entry_frame() const;
  const std::string& frames_text() const;
  std::vector<FrameCoverage> Coverage() const;
  std::vector<EagerFallbackWarning> Warnings() const;
  // The calls no variant matched, per frame (frame_index is the frame's
  // position in manifest().frames()), since the load.
  std::vector<FrameMisses> Misses() const;
  int miss_signatures_per_frame() const;
  // Instances of each variant that can run at once (LoadOptions).
  int runners_per_variant() const;

  class Impl;

 private:
  explicit LoadedVersion(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_LOADED_VERSION_H_
