// The eager executor's threads: where and at which priority work runs, in
// which order, and that a throw does not end a thread. Work that waits on
// notifications decides every test, never time.
#include "server/scheduling/eager_executor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "base/notification.h"

namespace precompile::server {
namespace {

int ThisThreadsNice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

TEST(EagerExecutor, RunsTheWorkOnItsOwnThreadsAtALowerPriority) {
  const int poster_nice = ThisThreadsNice();
  std::thread::id work_thread;
  int work_nice = -100;
  Notification done;
  {
    EagerExecutor executor(/*threads=*/1, /*nice=*/5);
    executor.Post([&] {
      work_thread = std::this_thread::get_id();
      work_nice = ThisThreadsNice();
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  }
  EXPECT_NE(work_thread, std::this_thread::get_id());
  EXPECT_EQ(work_nice, std::min(19, poster_nice + 5));
  // The posting thread keeps its priority.
  EXPECT_EQ(ThisThreadsNice(), poster_nice);
}

TEST(EagerExecutor, NiceZeroKeepsThePostersPriority) {
  int work_nice = -100;
  {
    EagerExecutor executor(/*threads=*/1, /*nice=*/0);
    executor.Post([&] { work_nice = ThisThreadsNice(); });
  }  // The destructor runs what was given.
  EXPECT_EQ(work_nice, ThisThreadsNice());
}

TEST(EagerExecutor, OneThreadRunsTheWorkInTheOrderGivenAndCountsWhatWaits) {
  std::vector<int> order;
  Notification release;
  Notification first_started;
  {
    EagerExecutor executor(/*threads=*/1, /*nice=*/0);
    executor.Post([&] {
      first_started.Notify();
      release.WaitForNotification();
      order.push_back(0);
    });
    first_started.WaitForNotification();
    for (int i = 1; i < 5; ++i) executor.Post([&order, i] { order.push_back(i); });
    EXPECT_EQ(executor.queued(), 4);
    release.Notify();
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(EagerExecutor, WorkThatThrowsLeavesTheThreadToTheNextWork) {
  bool ran = false;
  {
    EagerExecutor executor(/*threads=*/1, /*nice=*/0);
    executor.Post([] { throw std::runtime_error("an eager program that throws"); });
    executor.Post([&] { ran = true; });
  }
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace precompile::server
