// The eager executor with the real request scheduler: jobs stand in for
// requests, and work that waits on notifications stands in for eager
// programs, so every test decides by what ran where, never by how long.
#include "server/eager_executor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "base/notification.h"
#include "server/request_scheduler.h"

namespace precompile::server {
namespace {

int ThisThreadsNice() {
  return getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
}

class FunctionJob final : public RequestScheduler::Job {
 public:
  explicit FunctionJob(std::function<void()> run) : run_(std::move(run)) {}
  void Run() override {
    thread = std::this_thread::get_id();
    run_();
    ran.Notify();
  }
  void Complete() override {}

  std::thread::id thread;
  Notification ran;

 private:
  std::function<void()> run_;
};

TEST(EagerExecutor, RunsTheWorkOnItsOwnThreadsAtALowerPriority) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/1, /*nice=*/5, scheduler);
  const int request_nice = ThisThreadsNice();
  std::thread::id work_thread;
  int work_nice = -100;
  FunctionJob job([&] {
    executor.Run([&] {
      work_thread = std::this_thread::get_id();
      work_nice = ThisThreadsNice();
    });
  });
  ASSERT_TRUE(scheduler.Submit(&job).ok());
  EXPECT_EQ(job.thread, std::this_thread::get_id());
  EXPECT_NE(work_thread, std::this_thread::get_id());
  EXPECT_EQ(work_nice, std::min(19, request_nice + 5));
  // The request's own thread keeps its priority.
  EXPECT_EQ(ThisThreadsNice(), request_nice);
}

TEST(EagerExecutor, NiceZeroKeepsTheRequestsPriority) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/1, /*nice=*/0, scheduler);
  int work_nice = -100;
  FunctionJob job([&] { executor.Run([&] { work_nice = ThisThreadsNice(); }); });
  ASSERT_TRUE(scheduler.Submit(&job).ok());
  EXPECT_EQ(work_nice, ThisThreadsNice());
}

TEST(EagerExecutor, TheWaitingRequestsThreadRunsTheQueuedRequests) {
  // One run slot: a queued request can only run before the miss ends if
  // the miss's own thread runs it while it waits.
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/1, /*nice=*/0, scheduler);
  Notification miss_started;
  FunctionJob hit([] {});
  bool hit_ran_during_the_miss = false;
  FunctionJob miss([&] {
    executor.Run([&] {
      miss_started.Notify();
      hit_ran_during_the_miss = hit.ran.WaitForNotificationWithTimeout(absl::Seconds(20));
    });
  });
  std::thread request([&] { EXPECT_TRUE(scheduler.Submit(&miss).ok()); });
  miss_started.WaitForNotification();
  ASSERT_TRUE(scheduler.Submit(&hit).ok());  // Queued: the slot is the miss's.
  request.join();
  EXPECT_TRUE(hit_ran_during_the_miss);
  EXPECT_EQ(hit.thread, miss.thread);
  EXPECT_EQ(scheduler.in_flight(), 0);
  EXPECT_EQ(scheduler.queued(), 0);
}

TEST(EagerExecutor, MissesWaitingInTurnEachEndAfterTheirWork) {
  // A queued request that misses too waits inside the first one's wait:
  // both end, each after its own work, and the slot is given back.
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/2, /*nice=*/0, scheduler);
  Notification first_started;
  Notification release_first;
  Notification second_done;
  FunctionJob second([&] { executor.Run([&] { second_done.Notify(); }); });
  FunctionJob first([&] {
    executor.Run([&] {
      first_started.Notify();
      release_first.WaitForNotification();
    });
  });
  std::thread request([&] { EXPECT_TRUE(scheduler.Submit(&first).ok()); });
  first_started.WaitForNotification();
  ASSERT_TRUE(scheduler.Submit(&second).ok());
  // The second miss's work runs on the other eager thread, while the first
  // one's still blocks.
  EXPECT_TRUE(second_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  release_first.Notify();
  request.join();
  EXPECT_TRUE(first.ran.HasBeenNotified());
  EXPECT_TRUE(second.ran.HasBeenNotified());
  EXPECT_EQ(second.thread, first.thread);
  EXPECT_EQ(scheduler.in_flight(), 0);
  // The slot is free again: a new request runs at once on its own thread.
  FunctionJob after([] {});
  ASSERT_TRUE(scheduler.Submit(&after).ok());
  EXPECT_EQ(after.thread, std::this_thread::get_id());
}

TEST(EagerExecutor, AHitRunsWhileEightMissesWaitOneInsideAnother) {
  // One run slot and 8 misses, as from 8 clients: each queued miss runs
  // inside the wait of the one before it, and a hit queued last still runs
  // before any of them ends.
  constexpr int kMisses = 8;
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/kMisses, /*nice=*/0, scheduler);
  Notification release;
  std::vector<std::unique_ptr<Notification>> started;
  std::vector<std::unique_ptr<FunctionJob>> misses;
  for (int i = 0; i < kMisses; ++i) {
    started.push_back(std::make_unique<Notification>());
    Notification* s = started.back().get();
    misses.push_back(std::make_unique<FunctionJob>([&executor, &release, s] {
      executor.Run([&release, s] {
        s->Notify();
        release.WaitForNotification();
      });
    }));
  }
  std::thread request([&] { EXPECT_TRUE(scheduler.Submit(misses[0].get()).ok()); });
  started[0]->WaitForNotification();
  for (int i = 1; i < kMisses; ++i) ASSERT_TRUE(scheduler.Submit(misses[i].get()).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  for (int i = 1; i < kMisses; ++i) {
    EXPECT_TRUE(started[i]->WaitForNotificationWithTimeout(deadline - absl::Now())) << "miss " << i;
  }
  FunctionJob hit([] {});
  ASSERT_TRUE(scheduler.Submit(&hit).ok());
  EXPECT_TRUE(hit.ran.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(hit.thread, misses[0]->thread);
  release.Notify();
  request.join();
  for (const auto& miss : misses) EXPECT_TRUE(miss->ran.HasBeenNotified());
  EXPECT_EQ(scheduler.in_flight(), 0);
  EXPECT_EQ(scheduler.queued(), 0);
}

TEST(EagerExecutor, WhatTheWorkThrowsIsThrownOnTheWaitingThreadAndTheThreadGoesOn) {
  RequestScheduler scheduler(/*run_slots=*/1, /*max_in_flight=*/0);
  EagerExecutor executor(/*threads=*/1, /*nice=*/0, scheduler);
  bool caught = false;
  FunctionJob miss([&] {
    try {
      executor.Run([] { throw std::runtime_error("an eager program that throws"); });
    } catch (const std::runtime_error& e) {
      caught = std::string(e.what()) == "an eager program that throws";
    }
  });
  ASSERT_TRUE(scheduler.Submit(&miss).ok());
  EXPECT_TRUE(caught);
  // The executor's only thread survived the throw and runs the next miss.
  bool ran = false;
  FunctionJob next([&] { executor.Run([&] { ran = true; }); });
  ASSERT_TRUE(scheduler.Submit(&next).ok());
  EXPECT_TRUE(ran);
  EXPECT_EQ(scheduler.in_flight(), 0);
}

}  // namespace
}  // namespace precompile::server
