#include "runtime/torch_threads.h"

#include <ATen/Parallel.h>

namespace precompile {

void SetTorchThreads(int threads) { at::set_num_threads(threads); }

void UseTorchThreadsOnThisThread() {
  thread_local bool applied = false;
  if (applied) return;
  applied = true;
  at::init_num_threads();
}

}  // namespace precompile
