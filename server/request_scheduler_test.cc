// The request scheduler on its own: no gRPC, no torch. Jobs that block on a
// notification stand in for model calls, so every test decides by what ran
// where, never by how long it took.
#include "server/request_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/notification.h"

namespace precompile::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Records the thread it ran on, and blocks until released if asked to.
class RecordingJob final : public RequestScheduler::Job {
 public:
  explicit RecordingJob(Notification* release = nullptr) : release_(release) {}

  void Run() override {
    thread = std::this_thread::get_id();
    started.Notify();
    if (release_ != nullptr) release_->WaitForNotification();
    ran.fetch_add(1);
  }
  void Complete() override {}

  std::thread::id thread;
  Notification started;
  std::atomic<int> ran{0};

 private:
  Notification* const release_;
};

TEST(RequestScheduler, RunsAJobOnTheSubmittingThreadWhenASlotIsFree) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  RecordingJob job;
  ASSERT_TRUE(scheduler.Submit(&job).ok());
  EXPECT_EQ(job.ran.load(), 1);
  EXPECT_EQ(job.thread, std::this_thread::get_id());
  EXPECT_EQ(scheduler.in_flight(), 0);
}

TEST(RequestScheduler, QueuesWhileEverySlotIsBusyAndRunsTheQueueInOrderOnTheFreedThread) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  Notification release;
  RecordingJob blocking(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&blocking).ok()); });
  blocking.started.WaitForNotification();

  // Each queued job records the order it ran in.
  std::mutex mu;
  std::vector<int> order;
  struct Ordered final : RequestScheduler::Job {
    Ordered(int i, std::mutex* mu, std::vector<int>* order) : i(i), mu(mu), order(order) {}
    void Run() override {
      std::lock_guard<std::mutex> lock(*mu);
      order->push_back(i);
      thread = std::this_thread::get_id();
    }
    void Complete() override {}
    int i;
    std::mutex* mu;
    std::vector<int>* order;
    std::thread::id thread;
  };
  std::vector<std::unique_ptr<Ordered>> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(std::make_unique<Ordered>(i, &mu, &order));
    // Returns at once: the job waits, it does not run here.
    ASSERT_TRUE(scheduler.Submit(queued.back().get()).ok());
  }
  EXPECT_EQ(scheduler.queued(), 3);
  EXPECT_EQ(scheduler.in_flight(), 4);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(order.empty());
  }

  const std::thread::id runner_id = runner.get_id();
  release.Notify();
  runner.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (const auto& job : queued) EXPECT_EQ(job->thread, runner_id);
  EXPECT_EQ(scheduler.queued(), 0);
  EXPECT_EQ(scheduler.in_flight(), 0);
}

TEST(RequestScheduler, RefusesPastMaxInFlightCountingQueuedJobsAndAdmitsAgainOnceOneFinishes) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/2);
  Notification release;
  RecordingJob running(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&running).ok()); });
  running.started.WaitForNotification();
  RecordingJob queued;
  ASSERT_TRUE(scheduler.Submit(&queued).ok());  // In flight: one running, one queued.

  RecordingJob refused;
  const absl::Status refusal = scheduler.Submit(&refused);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refusal.message(), HasSubstr("limit of 2 concurrent inference requests"));
  EXPECT_EQ(refused.ran.load(), 0);
  EXPECT_EQ(scheduler.in_flight(), 2);

  release.Notify();
  runner.join();
  EXPECT_EQ(queued.ran.load(), 1);
  RecordingJob admitted;
  EXPECT_TRUE(scheduler.Submit(&admitted).ok());
  EXPECT_EQ(admitted.ran.load(), 1);
  EXPECT_EQ(refused.ran.load(), 0);
}

TEST(RequestScheduler, RefusesARequestWhoseBytesWouldPassTheLimitAndCountsThemUntilItFinishes) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0, /*max_in_flight_bytes=*/100);
  Notification release;
  RecordingJob running(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&running, 60).ok()); });
  running.started.WaitForNotification();
  EXPECT_EQ(scheduler.in_flight_bytes(), 60);

  RecordingJob too_big;
  const absl::Status refusal = scheduler.Submit(&too_big, 41);
  EXPECT_EQ(refusal.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refusal.message(), AllOf(HasSubstr("60 bytes of inference requests in flight"),
                                       HasSubstr("this request's 41"),
                                       HasSubstr("limit of 100 bytes")));
  EXPECT_EQ(too_big.ran.load(), 0);
  // A refusal gives back what it counted.
  EXPECT_EQ(scheduler.in_flight_bytes(), 60);
  EXPECT_EQ(scheduler.in_flight(), 1);

  RecordingJob fits;
  ASSERT_TRUE(scheduler.Submit(&fits, 40).ok());  // Queued, 100 bytes in flight.
  EXPECT_EQ(scheduler.in_flight_bytes(), 100);
  release.Notify();
  runner.join();
  EXPECT_EQ(fits.ran.load(), 1);
  EXPECT_EQ(scheduler.in_flight_bytes(), 0);
  RecordingJob again;
  EXPECT_TRUE(scheduler.Submit(&again, 41).ok());
  EXPECT_EQ(again.ran.load(), 1);
}

// A job sends its answer in Complete(), after it stops counting: a client
// that has its answer and calls again at once is admitted, even at a limit
// of one.
TEST(RequestScheduler, AJobNoLongerCountsAsInFlightWhenItCompletes) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/1);
  struct Answering final : RequestScheduler::Job {
    explicit Answering(RequestScheduler* scheduler) : scheduler(scheduler) {}
    void Run() override { in_flight_running = scheduler->in_flight(); }
    void Complete() override {
      in_flight_completing = scheduler->in_flight();
      next_admitted = scheduler->Submit(&next).ok();
    }
    RequestScheduler* scheduler;
    RecordingJob next;
    int in_flight_running = -1, in_flight_completing = -1;
    bool next_admitted = false;
  };
  Answering job(&scheduler);
  ASSERT_TRUE(scheduler.Submit(&job).ok());
  EXPECT_EQ(job.in_flight_running, 1);
  EXPECT_EQ(job.in_flight_completing, 0);
  EXPECT_TRUE(job.next_admitted);
  EXPECT_EQ(job.next.ran.load(), 1);
  EXPECT_EQ(scheduler.in_flight(), 0);
}

TEST(RequestScheduler, AwaitIdleWaitsForTheLastJobOrGivesUpAtTheDeadline) {
  RequestScheduler scheduler(/*run_slots=*/2, /*max_in_flight=*/0);
  EXPECT_TRUE(scheduler.AwaitIdle(absl::Now()));
  Notification release;
  RecordingJob running(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&running).ok()); });
  running.started.WaitForNotification();
  EXPECT_FALSE(scheduler.AwaitIdle(absl::Now() + absl::Milliseconds(20)));

  std::atomic<bool> idle{false};
  std::thread waiter([&] { idle = scheduler.AwaitIdle(absl::Now() + absl::Minutes(5)); });
  release.Notify();
  waiter.join();
  runner.join();
  EXPECT_TRUE(idle.load());
}

// Many threads submitting at once (TSan runs this too): every job runs
// exactly once, never more at once than there are slots, and the scheduler
// ends idle.
// Throws from Run() until it has thrown `throws` times; counts Complete().
class ThrowingJob final : public RequestScheduler::Job {
 public:
  explicit ThrowingJob(Notification* release = nullptr) : release_(release) {}
  void Run() override {
    started.Notify();
    if (release_ != nullptr) release_->WaitForNotification();
    throw std::runtime_error("a job that throws");
  }
  void Complete() override { completed.fetch_add(1); }

  Notification started;
  std::atomic<int> completed{0};

 private:
  Notification* const release_;
};

TEST(RequestScheduler, AJobThatThrowsGivesBackItsSlotAndIsStillCompleted) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/2);
  ThrowingJob thrower;
  ASSERT_TRUE(scheduler.Submit(&thrower).ok());
  EXPECT_EQ(thrower.completed.load(), 1);
  EXPECT_EQ(scheduler.in_flight(), 0);

  // Thrown from the queue too: a job that threw while others waited lets
  // them run, on the same slot.
  Notification release;
  ThrowingJob first(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&first).ok()); });
  first.started.WaitForNotification();
  RecordingJob queued;
  ASSERT_TRUE(scheduler.Submit(&queued).ok());
  release.Notify();
  runner.join();
  EXPECT_EQ(first.completed.load(), 1);
  EXPECT_EQ(queued.ran.load(), 1);
  EXPECT_EQ(scheduler.in_flight(), 0);
  EXPECT_TRUE(scheduler.AwaitIdle(absl::Now()));

  // With max_in_flight 2, two jobs stuck in flight would refuse this one.
  RecordingJob after;
  EXPECT_TRUE(scheduler.Submit(&after).ok());
  EXPECT_EQ(after.ran.load(), 1);
}

TEST(RequestScheduler, StalledForIsTheTimeSinceAJobLastFinishedWhileSomeAreInFlight) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EXPECT_EQ(scheduler.StalledFor(absl::Now() + absl::Hours(1)), absl::ZeroDuration());
  Notification release;
  RecordingJob blocking(&release);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&blocking).ok()); });
  blocking.started.WaitForNotification();
  const absl::Time later = absl::Now() + absl::Seconds(60);
  EXPECT_GE(scheduler.StalledFor(later), absl::Seconds(59));
  EXPECT_LE(scheduler.StalledFor(later), absl::Seconds(61));
  release.Notify();
  runner.join();
  EXPECT_EQ(scheduler.StalledFor(later), absl::ZeroDuration());
}

TEST(RequestScheduler, UnderContentionEachJobRunsOnceWithinTheSlots) {
  constexpr int kSlots = 3, kThreads = 8, kJobsPerThread = 500;
  RequestScheduler scheduler(kSlots, /*max_in_flight=*/0);
  std::atomic<int> running{0}, most{0}, ran{0};
  struct Counting final : RequestScheduler::Job {
    std::atomic<int>* running;
    std::atomic<int>* most;
    std::atomic<int>* ran;
    std::atomic<int> times{0};
    void Run() override {
      const int now = running->fetch_add(1) + 1;
      int seen = most->load();
      while (now > seen && !most->compare_exchange_weak(seen, now)) {
      }
      std::this_thread::yield();
      times.fetch_add(1);
      ran->fetch_add(1);
      running->fetch_sub(1);
    }
    void Complete() override {}
  };
  std::vector<std::unique_ptr<Counting>> jobs(kThreads * kJobsPerThread);
  for (auto& job : jobs) {
    job = std::make_unique<Counting>();
    job->running = &running;
    job->most = &most;
    job->ran = &ran;
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kJobsPerThread; ++i) {
        ASSERT_TRUE(scheduler.Submit(jobs[t * kJobsPerThread + i].get()).ok());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Minutes(1)));
  EXPECT_EQ(ran.load(), kThreads * kJobsPerThread);
  for (const auto& job : jobs) ASSERT_EQ(job->times.load(), 1);
  EXPECT_LE(most.load(), kSlots);
  EXPECT_EQ(scheduler.queued(), 0);
  EXPECT_EQ(scheduler.in_flight(), 0);
}

}  // namespace
}  // namespace precompile::server
