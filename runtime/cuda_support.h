// Loads libtorch's CUDA half on demand.
//
// CUDA artifacts need libtorch_cuda: its AOTInductor runner and kernels
// register themselves when the library loads ("Unsupported device key found:
// cuda" otherwise). It is loaded at run time rather than linked because it
// and its CUDA libraries bring over 100 KiB of static thread-local storage
// into every thread, which makes threads created with small stacks (such as
// the metrics HTTP server's) fail to start, and because a CPU-only server
// should not load gigabytes of CUDA libraries.
#ifndef PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_
#define PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_

#include "absl/status/status.h"

namespace precompile {

// Loads libtorch_cuda from the directory libtorch lives in. Idempotent.
// FAILED_PRECONDITION if it cannot be loaded or no CUDA device is usable.
absl::Status LoadCudaSupport();

// Whether CUDA support is loaded and a device is usable.
bool CudaAvailable();

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_
