// Checks in front of the ATen kernels that trust their inputs' values.
//
// A few of torch's kernels index memory with numbers they read from a tensor
// and bound-check them only partly or not at all: ctc_loss reads log_probs at
// each target class, so a target of 1e8 ends the process and one of -1 reads
// another allocation. Eager programs run these kernels on what a client sent,
// and so does compiled code, which calls embedding_bag's and segment_reduce's
// through AOTInductor's C shims; a binary that links this library has those
// shims call the operators through the dispatcher (kernel_input_checks.cc).
// Each check runs before its kernel on every device, at the dispatcher's
// BackendSelect key, which a call of an operator passes through whether it
// comes from TorchScript, Python or C++. (Under inference mode, as the
// runtime makes every call, that holds for every operator; with autograd on,
// an operator that autograd does not see, such as _pad_packed_sequence, runs
// its composite code before BackendSelect and is not checked.) A failed
// check raises IndexError naming the argument, so the call fails as any
// other raising operator does and the process serves on.
#ifndef PRECOMPILE_RUNTIME_KERNEL_INPUT_CHECKS_H_
#define PRECOMPILE_RUNTIME_KERNEL_INPUT_CHECKS_H_

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace precompile {

// Ends every check's message, so that whoever reports a failed call can say
// it failed on what its client sent rather than in the program.
inline constexpr absl::string_view kKernelInputRefused =
    "refused before the kernel ran, which does not check it";

// Registers the checks for this process, once; later calls return the first
// call's status.
absl::Status InstallKernelInputChecks();

// A failed call's status said as the client's doing (INVALID_ARGUMENT) where
// one of the checks refused what it sent; any other status as it is.
inline absl::Status KernelRefusalAsInvalidArgument(absl::Status status) {
  if (status.code() == absl::StatusCode::kInternal &&
      absl::StrContains(status.message(), kKernelInputRefused)) {
    return absl::InvalidArgumentError(status.message());
  }
  return status;
}

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_KERNEL_INPUT_CHECKS_H_
