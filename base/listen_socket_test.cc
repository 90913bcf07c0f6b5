#include "base/listen_socket.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "gtest/gtest.h"

namespace precompile {
namespace {

// Each case runs in a child process of its own (a death test): it changes
// the process's descriptor limit, and a hard limit lowered cannot be raised
// again.

void ReserveUnderAHardLimitOf1000() {
  const rlimit low{1000, 1000};
  if (setrlimit(RLIMIT_NOFILE, &low) != 0) std::exit(2);
  DescriptorShare http = DescriptorShare::Reserve(1024, 1);
  // What the first left, less the reserve of 256: nothing, so the floor.
  DescriptorShare front = DescriptorShare::Reserve(1024, 3);
  const int first = http.connections();
  const int second = front.connections();
  http = DescriptorShare();  // Given back.
  DescriptorShare again = DescriptorShare::Reserve(1024, 3);
  const int small = DescriptorShare::Reserve(3, 1).connections();
  std::fprintf(stderr, "shares %d %d %d %d\n", first, second, again.connections(), small);
  std::exit(0);
}

TEST(DescriptorShareDeathTest, SharesAreCountedTogetherWithinTheHardLimit) {
  EXPECT_EXIT(ReserveUnderAHardLimitOf1000(), ::testing::ExitedWithCode(0),
              "shares 744 16 232 3\n");
}

void ReserveFromASoftLimitOf512() {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = 512;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) std::exit(2);
  DescriptorShare front = DescriptorShare::Reserve(1024, 3);
  DescriptorShare http = DescriptorShare::Reserve(1024, 1);
  getrlimit(RLIMIT_NOFILE, &limit);
  std::fprintf(stderr, "soft %llu for %d and %d\n", static_cast<unsigned long long>(limit.rlim_cur),
               front.connections(), http.connections());
  std::exit(0);
}

TEST(DescriptorShareDeathTest, TheSoftLimitIsRaisedForAllSharesTogether) {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < 4352) {
    GTEST_SKIP() << "the hard limit, " << limit.rlim_max << ", is below what both shares need";
  }
  EXPECT_EXIT(ReserveFromASoftLimitOf512(), ::testing::ExitedWithCode(0),
              "soft 4352 for 1024 and 1024\n");
}

}  // namespace
}  // namespace precompile
