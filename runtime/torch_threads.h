// Process-wide torch settings a server may want, without torch's headers.
#ifndef PRECOMPILE_RUNTIME_TORCH_THREADS_H_
#define PRECOMPILE_RUNTIME_TORCH_THREADS_H_

namespace precompile {

// Threads one torch operation may use (torch's intra-op pool). Call before
// the first model call. REQUIRES: threads >= 1.
void SetTorchThreads(int threads);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_TORCH_THREADS_H_
