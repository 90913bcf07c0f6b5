// Process-wide torch settings a server may want, without torch's headers.
#ifndef PRECOMPILE_RUNTIME_TORCH_THREADS_H_
#define PRECOMPILE_RUNTIME_TORCH_THREADS_H_

namespace precompile {

// Threads one torch operation may use (torch's intra-op pool, and the
// OpenMP threads of the compiled kernels a model call runs: see
// UseTorchThreadsOnThisThread). Call before the first model call.
// REQUIRES: threads >= 1.
void SetTorchThreads(int threads);

// Gives the calling thread the OpenMP thread count SetTorchThreads set (if
// it was called), once per thread. OpenMP keeps that count per thread, and
// libtorch applies it only inside its own operators: a compiled kernel's
// `#pragma omp parallel` on a thread that never ran one would take as many
// threads as the process has cores. LoadedVersion::Call calls it.
void UseTorchThreadsOnThisThread();

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_TORCH_THREADS_H_
