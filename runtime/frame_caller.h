// The bridge between eager programs and the dispatcher.
//
// A frame's eager program (TorchScript) calls other captured frames through
// the operator precompile::call_frame(str frame, Any[] args) -> Tensor[], so
// that callees are served by their own variants (and refused on their own
// misses) rather than run eagerly too. The operator reaches the model whose
// eager program is running through the FrameCaller installed on the calling
// thread by ScopedFrameCaller.
#ifndef PRECOMPILE_RUNTIME_FRAME_CALLER_H_
#define PRECOMPILE_RUNTIME_FRAME_CALLER_H_

#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile {

class FrameCaller {
 public:
  virtual ~FrameCaller() = default;
  // Calls captured frame `frame` with positional `args`.
  virtual absl::StatusOr<std::vector<at::Tensor>> CallFrame(
      absl::string_view frame, std::vector<c10::IValue> args) = 0;
  // The running call's cancellation predicate (true: the call should stop,
  // its client cancelled it or its deadline passed), callable from any
  // thread while the call runs; null when the call has none.
  virtual const std::function<bool()>* Cancellation() = 0;
};

// The cancellation predicate of the call whose frame this thread runs (see
// FrameCaller::Cancellation); null outside a call of a loaded model.
const std::function<bool()>* CurrentCancellation();

// Installs `caller` for the current thread for the scope's lifetime (scopes
// nest: the previous caller is restored). Not movable.
class ScopedFrameCaller {
 public:
  explicit ScopedFrameCaller(FrameCaller* caller);
  ~ScopedFrameCaller();
  ScopedFrameCaller(const ScopedFrameCaller&) = delete;
  ScopedFrameCaller& operator=(const ScopedFrameCaller&) = delete;

 private:
  FrameCaller* previous_;
};

// The operator precompile::check_cancelled() -> () ends a call that should
// stop: the capture puts it at the start of every loop body of a TorchScript
// eager program, whose loops may run as long as a request parameter says.
// It fails with CANCELLED (through TakeCalleeStatus); outside a call of a
// loaded model it does nothing.
//
// When the operator fails because a callee's call failed, it throws through
// the TorchScript interpreter (which only speaks exceptions) and keeps the
// callee's status here, so the caller can return it unchanged (code and
// message) rather than as an interpreter error. Takes and clears it.
std::optional<absl::Status> TakeCalleeStatus();

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_FRAME_CALLER_H_
