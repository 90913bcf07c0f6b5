#include "runtime/torch_threads.h"

#include <ATen/Parallel.h>

namespace precompile {

void SetTorchThreads(int threads) { at::set_num_threads(threads); }

}  // namespace precompile
