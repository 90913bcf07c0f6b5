// What the runtime reports about each frame call, for metrics and logs.
#ifndef PRECOMPILE_RUNTIME_OBSERVER_H_
#define PRECOMPILE_RUNTIME_OBSERVER_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/value.h"

namespace precompile {

struct FrameCallEvent {
  absl::string_view model;
  absl::string_view frame;
  // The frame's and variant's positions in the manifest, for observers that
  // keep per-frame state in arrays; variant_index is -1 unless kVariant.
  int frame_index = 0;
  int variant_index = -1;
  // The call came from a request (the entry frame) rather than from another
  // frame's eager program.
  bool is_entry = false;
  Outcome outcome = Outcome::kVariant;
  // The variant that ran; empty unless outcome is kVariant.
  absl::string_view variant_id;
  // Guard evaluation, including the explanation of a miss.
  absl::Duration dispatch_time;
  // The variant's or the eager program's run; zero for a refusal.
  absl::Duration run_time;
  // For a miss (an eager fallback or a refusal): the distinct signatures of
  // missed calls the frame keeps, this one included; 0 otherwise.
  size_t miss_signatures = 0;
};

// Receives every frame call of the models it is registered with.
//
// Thread safety: methods are called concurrently from the calling threads
// and must not block for long. They must not call back into the LoadedVersion.
class CallObserver {
 public:
  virtual ~CallObserver() = default;

  virtual void OnFrameCall(const FrameCallEvent& event) = 0;

  // The first eager miss of a flagged frame (once per frame and model load).
  virtual void OnEagerFallbackWarning(absl::string_view model,
                                      absl::string_view frame,
                                      absl::string_view message) = 0;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_OBSERVER_H_
