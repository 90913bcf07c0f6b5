// Thread counts follow the serving process, not the capture machine.
#include "runtime/torch_threads.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <thread>

#include "base/usable_cores.h"

namespace precompile {
namespace {

// The count a `#pragma omp parallel` on this thread would take: the OpenMP
// runtime's, which libtorch loads (this test does not link it itself).
int omp_get_max_threads() {
  static const auto get = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return get != nullptr ? get() : -1;
}

TEST(TorchThreads, AThreadThatRunsAModelCallTakesTheCountSet) {
  const int count = UsableCores() + 1;  // A count no default gives.
  SetTorchThreads(count);
  int before = 0, after = 0, again = 0;
  std::thread([&] {
    before = omp_get_max_threads();
    UseTorchThreadsOnThisThread();
    after = omp_get_max_threads();
    UseTorchThreadsOnThisThread();
    again = omp_get_max_threads();
  }).join();
  ASSERT_NE(before, -1) << "no OpenMP runtime loaded";
  EXPECT_NE(before, count) << "a new thread starts with OpenMP's own default";
  EXPECT_EQ(after, count);
  EXPECT_EQ(again, count);
}

}  // namespace
}  // namespace precompile
