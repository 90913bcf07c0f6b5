// Loads libtorch's CUDA half on demand.
//
// CUDA artifacts need libtorch_cuda: its AOTInductor runner and kernels
// register themselves when the library loads ("Unsupported device key found:
// cuda" otherwise). It is loaded at run time rather than linked because it
// and its CUDA libraries bring over 100 KiB of static thread-local storage
// into every thread, which makes threads created with small stacks fail to
// start (a metrics HTTP server's once did), and because a CPU-only server
// should not load gigabytes of CUDA libraries.
#ifndef PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_
#define PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace precompile {

// Loads libtorch_cuda from the directory libtorch lives in. Idempotent.
// FAILED_PRECONDITION if it cannot be loaded or no CUDA device is usable.
absl::Status LoadCudaSupport();

// Whether CUDA support is loaded and a device is usable.
bool CudaAvailable();

// What a model call on CUDA runs with, on the calling thread from Enter
// until the object goes, when the thread's previous device and stream are
// current again: the model's device current, so that copies to the GPU and
// what libtorch allocates go there; and, with `own_stream`, a stream of the
// thread's own from libtorch's pool, current for that device. What libtorch
// and AOTInductor's runners queue on the thread meanwhile goes on it: a
// model call on a stream of its own neither waits for other calls' work nor
// makes them wait for its, where on the one default stream each call's
// copies synchronised the device for every call at once.
//
// Thread safety: each object belongs to the thread that entered it.
class CudaCall {
 public:
  // `device_index` -1: the current device. FAILED_PRECONDITION without CUDA
  // support (LoadCudaSupport); INTERNAL if libtorch refuses.
  static absl::StatusOr<std::unique_ptr<CudaCall>> Enter(int device_index, bool own_stream);
  ~CudaCall();
  CudaCall(const CudaCall&) = delete;
  CudaCall& operator=(const CudaCall&) = delete;

 private:
  struct Previous;
  explicit CudaCall(std::unique_ptr<Previous> previous);
  std::unique_ptr<Previous> previous_;
};

// Whether libtorch allocates pinned host memory (runtime/call_binding.h's
// CudaCopies::kPinned): FAILED_PRECONDITION naming why not. REQUIRES:
// LoadCudaSupport succeeded.
absl::Status CheckPinnedMemory();

// Waits until the work queued on the calling thread's current stream of the
// device (-1: the current device) is done. INTERNAL with CUDA's error.
absl::Status SynchronizeCurrentStream(int device_index);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_CUDA_SUPPORT_H_
