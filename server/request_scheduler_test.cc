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

  Next Run() override {
    thread = std::this_thread::get_id();
    started.Notify();
    if (release_ != nullptr) release_->WaitForNotification();
    ran.fetch_add(1);
    return Next::kDone;
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
    Next Run() override {
      std::lock_guard<std::mutex> lock(*mu);
      order->push_back(i);
      thread = std::this_thread::get_id();
      return Next::kDone;
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
    Next Run() override {
      in_flight_running = scheduler->in_flight();
      return Next::kDone;
    }
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
  Next Run() override {
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
    Next Run() override {
      const int now = running->fetch_add(1) + 1;
      int seen = most->load();
      while (now > seen && !most->compare_exchange_weak(seen, now)) {
      }
      std::this_thread::yield();
      times.fetch_add(1);
      ran->fetch_add(1);
      running->fetch_sub(1);
      return Next::kDone;
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

// A request that turns into an eager miss: Run() on a run slot, then
// RunEager(), blocking until released if asked to. Records where each ran
// and at what in-flight count of `scheduler` it was Complete()d. An eager
// thread may still be inside Complete() when the test sees it completed:
// tests declare these jobs before the scheduler, whose destructor joins its
// eager threads.
class MissJob final : public RequestScheduler::Job {
 public:
  explicit MissJob(Notification* release = nullptr, bool throws = false)
      : release_(release), throws_(throws) {}

  Next Run() override {
    run_thread = std::this_thread::get_id();
    return Next::kEager;
  }
  void RunEager() override {
    eager_thread = std::this_thread::get_id();
    eager_started.Notify();
    if (release_ != nullptr) release_->WaitForNotification();
    if (throws_) throw std::runtime_error("an eager program that throws");
  }
  void Complete() override {
    complete_thread = std::this_thread::get_id();
    in_flight_completing = scheduler->in_flight();
    completed.Notify();
  }

  RequestScheduler* scheduler = nullptr;
  std::thread::id run_thread, eager_thread, complete_thread;
  Notification eager_started;
  Notification completed;
  int in_flight_completing = -1;

 private:
  Notification* const release_;
  const bool throws_;
};

TEST(RequestScheduler, AMissGivesBackItsSlotAndEndsOnAnEagerThread) {
  // One run slot: the hit could not run before the miss ends if the miss
  // kept it.
  Notification release;
  MissJob miss(&release);
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0, 0, {/*threads=*/1, 0});
  miss.scheduler = &scheduler;
  ASSERT_TRUE(scheduler.Submit(&miss).ok());
  EXPECT_EQ(miss.run_thread, std::this_thread::get_id());
  ASSERT_TRUE(miss.eager_started.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_NE(miss.eager_thread, std::this_thread::get_id());
  EXPECT_EQ(scheduler.in_flight(), 1) << "a miss counts in flight until it is answered";
  EXPECT_FALSE(scheduler.AwaitIdle(absl::Now()));

  RecordingJob hit;
  ASSERT_TRUE(scheduler.Submit(&hit).ok());
  EXPECT_EQ(hit.ran.load(), 1);
  EXPECT_EQ(hit.thread, std::this_thread::get_id()) << "the hit waited for a slot";
  EXPECT_FALSE(miss.completed.HasBeenNotified());

  release.Notify();
  ASSERT_TRUE(miss.completed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(miss.complete_thread, miss.eager_thread);
  EXPECT_EQ(miss.in_flight_completing, 0);
  EXPECT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(20)));
}

TEST(RequestScheduler, AQueuedMissWaitsForAnEagerThreadNotInsideAnotherMiss) {
  // One eager thread: the second miss runs after the first, on the same
  // eager thread, and neither holds the run slot meanwhile.
  Notification release_first;
  MissJob first(&release_first);
  MissJob second;
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0, 0, {/*threads=*/1, 0});
  first.scheduler = second.scheduler = &scheduler;
  ASSERT_TRUE(scheduler.Submit(&first).ok());
  ASSERT_TRUE(first.eager_started.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(scheduler.Submit(&second).ok());
  EXPECT_EQ(second.run_thread, std::this_thread::get_id());
  EXPECT_EQ(scheduler.eager_queued(), 1);
  EXPECT_EQ(scheduler.in_flight(), 2);
  // Hits still run at once, on the submitting thread: no miss holds the slot.
  for (int i = 0; i < 8; ++i) {
    RecordingJob hit;
    ASSERT_TRUE(scheduler.Submit(&hit).ok());
    EXPECT_EQ(hit.ran.load(), 1);
  }
  EXPECT_FALSE(second.eager_started.HasBeenNotified());
  release_first.Notify();
  ASSERT_TRUE(second.completed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(first.completed.HasBeenNotified());
  EXPECT_EQ(second.eager_thread, first.eager_thread);
  EXPECT_EQ(scheduler.eager_queued(), 0);
  EXPECT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(20)));
}

TEST(RequestScheduler, AMissThatThrowsOnItsEagerThreadIsStillCompleted) {
  MissJob thrower(nullptr, /*throws=*/true);
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/1, 0, {/*threads=*/1, 0});
  thrower.scheduler = &scheduler;
  ASSERT_TRUE(scheduler.Submit(&thrower).ok());
  ASSERT_TRUE(thrower.completed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(20)));
  // With max_in_flight 1, a miss stuck in flight would refuse this one.
  RecordingJob after;
  EXPECT_TRUE(scheduler.Submit(&after).ok());
  EXPECT_EQ(after.ran.load(), 1);
}

TEST(RequestScheduler, WithoutEagerThreadsAMissRunsOnItsSlot) {
  MissJob miss;
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  miss.scheduler = &scheduler;
  ASSERT_TRUE(scheduler.Submit(&miss).ok());
  EXPECT_TRUE(miss.completed.HasBeenNotified());
  EXPECT_EQ(miss.eager_thread, std::this_thread::get_id());
  EXPECT_EQ(scheduler.in_flight(), 0);
}

TEST(RequestScheduler, ManyMissesAndHitsFromManyThreadsEachEndOnce) {
  // TSan runs this too: hits and misses from 6 threads on 2 slots and 2
  // eager threads all end, each once, and the scheduler ends idle.
  constexpr int kThreads = 6, kPerThread = 300;
  struct Mixed final : RequestScheduler::Job {
    bool miss = false;
    std::atomic<int> runs{0}, eager_runs{0}, completes{0};
    Next Run() override {
      runs.fetch_add(1);
      return miss ? Next::kEager : Next::kDone;
    }
    void RunEager() override { eager_runs.fetch_add(1); }
    void Complete() override { completes.fetch_add(1); }
  };
  std::vector<std::unique_ptr<Mixed>> jobs(kThreads * kPerThread);
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i] = std::make_unique<Mixed>();
    jobs[i]->miss = i % 3 == 0;
  }
  {
    RequestScheduler scheduler(/*run_slots=*/2, /*max_in_flight=*/0, 0, {/*threads=*/2, 0});
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          EXPECT_TRUE(scheduler.Submit(jobs[t * kPerThread + i].get()).ok());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(60)));
    EXPECT_EQ(scheduler.queued(), 0);
    EXPECT_EQ(scheduler.eager_queued(), 0);
  }  // Joins the eager threads: every Complete() has returned.
  for (const auto& job : jobs) {
    EXPECT_EQ(job->runs.load(), 1);
    EXPECT_EQ(job->eager_runs.load(), job->miss ? 1 : 0);
    EXPECT_EQ(job->completes.load(), 1);
  }
}

}  // namespace
}  // namespace precompile::server
