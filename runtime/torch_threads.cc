#include "runtime/torch_threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <algorithm>
#include <thread>

namespace precompile {

void SetTorchThreads(int threads) { at::set_num_threads(threads); }

void UseTorchThreadsOnThisThread() {
  thread_local bool applied = false;
  if (applied) return;
  applied = true;
  at::init_num_threads();
}

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace precompile
