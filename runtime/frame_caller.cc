// Registers precompile::call_frame and precompile::check_cancelled. Linked
// with alwayslink: nothing refers to this file's symbols, but eager programs
// cannot be loaded without the operators (torch::jit::load fails with
// "Unknown builtin op").
#include <torch/library.h>

#include <optional>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "runtime/frame_caller.h"

namespace precompile {
namespace {

thread_local FrameCaller* current_caller = nullptr;
thread_local std::optional<absl::Status> callee_status;

std::vector<at::Tensor> CallFrameOp(std::string frame,
                                    c10::List<c10::IValue> args) {
  FrameCaller* caller = current_caller;
  TORCH_CHECK(caller != nullptr, "precompile::call_frame('", frame,
              "') was called outside a call of a loaded precompile model");
  std::vector<c10::IValue> positional(args.begin(), args.end());
  absl::StatusOr<std::vector<at::Tensor>> result = caller->CallFrame(
      frame, std::move(positional));
  if (!result.ok()) {
    std::string message(result.status().message());
    callee_status = result.status();
    throw std::runtime_error(message);
  }
  return *std::move(result);
}

void CheckCancelledOp() {
  const std::function<bool()>* cancelled = CurrentCancellation();
  if (cancelled == nullptr || !(*cancelled)()) return;
  callee_status = absl::CancelledError(
      "the call was cancelled (or ran past its deadline) while an eager program ran");
  throw std::runtime_error(std::string(callee_status->message()));
}

}  // namespace

ScopedFrameCaller::ScopedFrameCaller(FrameCaller* caller)
    : previous_(current_caller) {
  current_caller = caller;
}

ScopedFrameCaller::~ScopedFrameCaller() { current_caller = previous_; }

const std::function<bool()>* CurrentCancellation() {
  return current_caller != nullptr ? current_caller->Cancellation() : nullptr;
}

std::optional<absl::Status> TakeCalleeStatus() {
  std::optional<absl::Status> status = std::move(callee_status);
  callee_status.reset();
  return status;
}

TORCH_LIBRARY(precompile, m) {
  m.def("call_frame(str frame, Any[] args) -> Tensor[]", &CallFrameOp);
  // CONSERVATIVE: an operator without outputs that TorchScript thinks pure
  // would be removed as dead code.
  m.def(torch::schema("check_cancelled() -> ()", c10::AliasAnalysisKind::CONSERVATIVE),
        &CheckCancelledOp);
}

}  // namespace precompile
