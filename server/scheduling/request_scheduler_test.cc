// The request scheduler on its own: no gRPC, no torch. Jobs that block on a
// notification stand in for model calls, so every test decides by what ran
// where, never by how long it took.
#include "server/scheduling/request_scheduler.h"

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

// Submits `jobs` from `threads` threads at once, each its consecutive share
// in order, and waits until every Submit has returned.
template <typename Job>
void SubmitFromThreads(RequestScheduler& scheduler, const std::vector<std::unique_ptr<Job>>& jobs,
                       int threads) {
  const size_t per_thread = jobs.size() / static_cast<size_t>(threads);
  std::vector<std::thread> submitters;
  for (int t = 0; t < threads; ++t) {
    submitters.emplace_back([&, t] {
      for (size_t i = 0; i < per_thread; ++i) {
        EXPECT_TRUE(scheduler.Submit(jobs[t * per_thread + i].get()).ok());
      }
    });
  }
  for (std::thread& t : submitters) t.join();
}

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
    SubmitFromThreads(scheduler, jobs, kThreads);
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

// Joins batches of its key; the first member's RunBatch records the batch
// (by the members' ids) and the thread it ran on.
struct BatchLog {
  std::mutex mu;
  std::vector<std::vector<int>> batches;
  std::vector<std::thread::id> threads;
  std::vector<absl::Time> times;
  std::vector<std::vector<int>> Batches() {
    std::lock_guard<std::mutex> lock(mu);
    return batches;
  }
};

class BatchJob final : public RequestScheduler::Job {
 public:
  BatchJob(int id, BatchLog* log, std::string key, int64_t rows = 1) : id(id), log_(log) {
    ticket.key = std::move(key);
    ticket.rows = rows;
    ticket.max_rows = 100;
    ticket.full_rows = 100;
    ticket.max_delay = absl::Hours(1);
  }

  Next Run() override { return Next::kBatch; }
  const BatchTicket* batch_ticket() const override { return &ticket; }
  void RunBatch(absl::Span<Job* const> members, absl::Span<Next> next) override {
    std::vector<int> ids;
    for (size_t i = 0; i < members.size(); ++i) {
      auto* member = static_cast<BatchJob*>(members[i]);
      ids.push_back(member->id);
      if (member->eager) next[i] = Next::kEager;
    }
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->batches.push_back(ids);
      log_->threads.push_back(std::this_thread::get_id());
      log_->times.push_back(absl::Now());
    }
    if (throws) throw std::runtime_error("batch failed");
  }
  void RunEager() override { eager_thread = std::this_thread::get_id(); }
  void Complete() override { completes.fetch_add(1); }

  const int id;
  BatchTicket ticket;
  bool eager = false;
  bool throws = false;
  std::thread::id eager_thread;
  std::atomic<int> completes{0};

 private:
  BatchLog* const log_;
};

TEST(RequestScheduler, AFullBatchRunsAtOnceOnTheThreadThatFilledIt) {
  BatchLog log;
  std::vector<std::unique_ptr<BatchJob>> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(std::make_unique<BatchJob>(i, &log, "m"));
    jobs.back()->ticket.full_rows = 3;
  }
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(jobs[0].get()).ok());
  ASSERT_TRUE(scheduler.Submit(jobs[1].get()).ok());
  EXPECT_TRUE(log.Batches().empty()) << "a batch waits until it is full or due";
  EXPECT_EQ(scheduler.in_flight(), 2);
  EXPECT_EQ(scheduler.batch_waiting(), 2);
  ASSERT_TRUE(scheduler.Submit(jobs[2].get()).ok());
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 1, 2}));
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  EXPECT_EQ(scheduler.in_flight(), 0);
  EXPECT_EQ(scheduler.batch_waiting(), 0);
  for (const auto& job : jobs) EXPECT_EQ(job->completes.load(), 1);
}

TEST(RequestScheduler, RequestsQueuedBeforeABatchOpenedJoinItBeforeItRuns) {
  BatchLog log;
  Notification release;
  RecordingJob blocking(&release);
  std::vector<std::unique_ptr<BatchJob>> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(std::make_unique<BatchJob>(i, &log, "m"));
    jobs.back()->ticket.max_delay = absl::ZeroDuration();
  }
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&blocking).ok()); });
  blocking.started.WaitForNotification();
  for (const auto& job : jobs) ASSERT_TRUE(scheduler.Submit(job.get()).ok());
  EXPECT_EQ(scheduler.queued(), 4);
  release.Notify();
  runner.join();
  ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  // With no delay, the batch is what was queued when it opened: all four.
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 1, 2, 3}));
}

TEST(RequestScheduler, ARequestThatWouldOverflowABatchRunsItAndOpensTheNext) {
  BatchLog log;
  BatchJob three(0, &log, "m", 3), two(1, &log, "m", 2), other(2, &log, "m", 2);
  for (BatchJob* job : {&three, &two, &other}) {
    job->ticket.max_rows = 4;
    job->ticket.full_rows = 4;
  }
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(&three).ok());
  ASSERT_TRUE(scheduler.Submit(&two).ok());
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0}));
  ASSERT_TRUE(scheduler.Submit(&other).ok());
  EXPECT_THAT(log.Batches(),
              ::testing::ElementsAre(std::vector<int>{0}, std::vector<int>{1, 2}));
  EXPECT_EQ(scheduler.in_flight(), 0);
}

// Preferred sizes 2 and 6 (full): jobs `first` to `first + count - 1` of
// one row each.
constexpr int64_t kPreferredRows[] = {2, 6};
std::vector<std::unique_ptr<BatchJob>> PreferringJobs(int first, int count, BatchLog* log) {
  std::vector<std::unique_ptr<BatchJob>> jobs;
  for (int i = first; i < first + count; ++i) {
    jobs.push_back(std::make_unique<BatchJob>(i, log, "m"));
    jobs.back()->ticket.full_rows = 6;
    jobs.back()->ticket.preferred_rows = kPreferredRows;
  }
  return jobs;
}

TEST(RequestScheduler, ABatchAtAPreferredSizeRunsAtOnceWhenNothingWaitsToJoinIt) {
  BatchLog log;
  std::vector<std::unique_ptr<BatchJob>> jobs = PreferringJobs(0, 3, &log);
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(jobs[0].get()).ok());
  EXPECT_TRUE(log.Batches().empty()) << "1 row is no preferred size: it waits (an hour)";
  ASSERT_TRUE(scheduler.Submit(jobs[1].get()).ok());
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 1}));
  EXPECT_EQ(log.threads[0], std::this_thread::get_id());
  ASSERT_TRUE(scheduler.Submit(jobs[2].get()).ok());
  EXPECT_EQ(log.Batches().size(), 1u) << "the next batch opened and waits";
  EXPECT_EQ(scheduler.batch_waiting(), 1);
}

TEST(RequestScheduler, ABatchAtAPreferredSizeWaitsForRequestsQueuedToJoinIt) {
  BatchLog log;
  Notification release;
  RecordingJob blocking(&release);
  std::vector<std::unique_ptr<BatchJob>> jobs = PreferringJobs(0, 3, &log);
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  std::thread runner([&] { EXPECT_TRUE(scheduler.Submit(&blocking).ok()); });
  blocking.started.WaitForNotification();
  for (const auto& job : jobs) ASSERT_TRUE(scheduler.Submit(job.get()).ok());
  release.Notify();
  runner.join();
  // At 2 rows the third was still queued: it joined, and 3 rows, no
  // preferred size, wait for more.
  EXPECT_TRUE(log.Batches().empty());
  EXPECT_EQ(scheduler.batch_waiting(), 3);
  std::vector<std::unique_ptr<BatchJob>> more = PreferringJobs(3, 3, &log);
  for (const auto& job : more) ASSERT_TRUE(scheduler.Submit(job.get()).ok());
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(RequestScheduler, RequestsWithDifferentKeysNeverShareABatch) {
  BatchLog log;
  BatchJob a0(0, &log, "a"), b(1, &log, "b"), a1(2, &log, "a");
  for (BatchJob* job : {&a0, &b, &a1}) job->ticket.full_rows = 2;
  {
    RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
    ASSERT_TRUE(scheduler.Submit(&a0).ok());
    ASSERT_TRUE(scheduler.Submit(&b).ok());
    ASSERT_TRUE(scheduler.Submit(&a1).ok());
    EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 2}));
    EXPECT_EQ(scheduler.batch_waiting(), 1);
  }  // The scheduler runs the batches still open as it goes.
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0, 2}, std::vector<int>{1}));
  EXPECT_EQ(b.completes.load(), 1);
}

TEST(RequestScheduler, AnOpenBatchRunsOnceItsDelayPasses) {
  BatchLog log;
  BatchJob job(0, &log, "m");
  job.ticket.max_delay = absl::Milliseconds(30);
  const absl::Time submitted = absl::Now();
  {
    RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
    ASSERT_TRUE(scheduler.Submit(&job).ok());
    ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  }  // Joins the timer's thread: Complete() has returned.
  ASSERT_EQ(log.Batches().size(), 1u);
  EXPECT_NE(log.threads[0], std::this_thread::get_id());
  EXPECT_GE(log.times[0] - submitted, absl::Milliseconds(30)) << "it waited for others";
  EXPECT_EQ(job.completes.load(), 1);
}

TEST(RequestScheduler, ABatchRunsByItsEarliestMembersDeadline) {
  BatchLog log;
  BatchJob job(0, &log, "m");
  job.ticket.deadline = absl::Now() + absl::Milliseconds(20);
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(&job).ok());
  // Its delay is an hour: only the deadline can have run it.
  ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_EQ(log.Batches().size(), 1u);
}

TEST(RequestScheduler, ADrainStopsBatchesWaiting) {
  BatchLog log;
  BatchJob open(0, &log, "m"), later(1, &log, "m");
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(&open).ok());
  EXPECT_FALSE(scheduler.AwaitIdle(absl::Now() + absl::Milliseconds(50)))
      << "its delay is an hour";
  scheduler.StopWaitingForBatches();
  ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  ASSERT_TRUE(scheduler.Submit(&later).ok());
  ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  EXPECT_THAT(log.Batches(), ::testing::ElementsAre(std::vector<int>{0}, std::vector<int>{1}));
}

TEST(RequestScheduler, ABatchMemberMayGoOnAsAnEagerMiss) {
  BatchLog log;
  BatchJob hit(0, &log, "m"), miss(1, &log, "m");
  for (BatchJob* job : {&hit, &miss}) job->ticket.full_rows = 2;
  miss.eager = true;
  {
    RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0, 0, {/*threads=*/1, 0});
    ASSERT_TRUE(scheduler.Submit(&hit).ok());
    ASSERT_TRUE(scheduler.Submit(&miss).ok());
    ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(30)));
  }
  EXPECT_EQ(hit.eager_thread, std::thread::id());
  EXPECT_NE(miss.eager_thread, std::thread::id());
  EXPECT_NE(miss.eager_thread, std::this_thread::get_id());
  EXPECT_EQ(hit.completes.load(), 1);
  EXPECT_EQ(miss.completes.load(), 1);
}

TEST(RequestScheduler, ABatchThatThrowsStillCompletesEveryMember) {
  BatchLog log;
  BatchJob first(0, &log, "m"), second(1, &log, "m");
  for (BatchJob* job : {&first, &second}) job->ticket.full_rows = 2;
  first.throws = true;
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  ASSERT_TRUE(scheduler.Submit(&first).ok());
  ASSERT_TRUE(scheduler.Submit(&second).ok());
  EXPECT_EQ(log.Batches().size(), 1u);
  EXPECT_EQ(first.completes.load(), 1);
  EXPECT_EQ(second.completes.load(), 1);
  EXPECT_EQ(scheduler.in_flight(), 0);
}

TEST(RequestScheduler, ManyBatchesFromManyThreadsEachMemberRunsOnce) {
  constexpr int kThreads = 4, kPerThread = 50;
  BatchLog log;
  std::vector<std::unique_ptr<BatchJob>> jobs;
  for (int i = 0; i < kThreads * kPerThread; ++i) {
    jobs.push_back(std::make_unique<BatchJob>(i, &log, i % 2 ? "odd" : "even"));
    jobs.back()->ticket.full_rows = 3;
    jobs.back()->ticket.max_delay = absl::Microseconds(200);
  }
  {
    RequestScheduler scheduler(/*run_slots=*/2, /*max_in_flight=*/0);
    SubmitFromThreads(scheduler, jobs, kThreads);
    ASSERT_TRUE(scheduler.AwaitIdle(absl::Now() + absl::Seconds(60)));
  }
  std::vector<int> seen(jobs.size());
  for (const std::vector<int>& batch : log.Batches()) {
    EXPECT_LE(batch.size(), 3u);
    for (int id : batch) {
      ++seen[id];
      EXPECT_EQ(id % 2, batch[0] % 2) << "a batch mixes keys";
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(seen[i], 1) << i;
    EXPECT_EQ(jobs[i]->completes.load(), 1) << i;
  }
}

}  // namespace
}  // namespace precompile::server
