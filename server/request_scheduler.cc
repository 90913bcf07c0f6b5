#include "server/request_scheduler.h"

#include <algorithm>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "spdlog/spdlog.h"

namespace precompile::server {

namespace {

// The last barrier around a job's parts: a job that threw would otherwise
// keep its slot and its place in flight for ever (every request then hangs
// and the drain fails), or end the process on a thread that cannot unwind
// further.
void RunCaught(absl::FunctionRef<void()> part) {
  try {
    part();
  } catch (...) {
    spdlog::error("event=job_threw what=\"{}\"", DescribeCaughtException().what);
  }
}

}  // namespace

RequestScheduler::RequestScheduler(int run_slots, int max_in_flight, int64_t max_in_flight_bytes,
                                   EagerThreads eager)
    : run_slots_(run_slots),
      max_in_flight_(max_in_flight),
      max_in_flight_bytes_(max_in_flight_bytes),
      eager_(eager.threads > 0 ? std::make_unique<EagerExecutor>(eager.threads, eager.nice)
                               : nullptr) {}

RequestScheduler::~RequestScheduler() { eager_.reset(); }

absl::Status RequestScheduler::Submit(Job* job, int64_t request_bytes) {
  const int now = in_flight_.fetch_add(1) + 1;
  if (now == 1) last_progress_ns_.store(absl::ToUnixNanos(absl::Now()));
  if (max_in_flight_ > 0 && now > max_in_flight_) {
    Finished(0);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server is at its limit of ", max_in_flight_,
        " concurrent inference requests; retry later"));
  }
  const int64_t bytes = in_flight_bytes_.fetch_add(request_bytes) + request_bytes;
  if (max_in_flight_bytes_ > 0 && bytes > max_in_flight_bytes_) {
    Finished(request_bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server holds ", bytes - request_bytes, " bytes of inference requests in flight, and "
        "this request's ", request_bytes, " would pass its limit of ", max_in_flight_bytes_,
        " bytes (--max_in_flight_request_bytes); retry later"));
  }
  job->request_bytes_ = request_bytes;
  if (TakeRunSlot()) {
    RunWhileWork(job);
    return absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queue_.push_back(job);
    queued_.fetch_add(1);
  }
  // Every running thread may have looked at the queue before this job was
  // in it, and left: then a slot is free, and this thread drains the queue.
  if (TakeRunSlot()) RunWhileWork(nullptr);
  return absl::OkStatus();
}

bool RequestScheduler::TakeRunSlot() {
  int running = running_.load();
  while (running < run_slots_) {
    if (running_.compare_exchange_weak(running, running + 1)) return true;
  }
  return false;
}

RequestScheduler::Job* RequestScheduler::PopQueued() {
  if (queued_.load() == 0) return nullptr;
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (queue_.empty()) return nullptr;  // Another thread took it meanwhile.
  Job* job = queue_.front();
  queue_.pop_front();
  queued_.fetch_sub(1);
  return job;
}

void RequestScheduler::RunWhileWork(Job* job) {
  while (true) {
    if (job == nullptr) job = PopQueued();
    if (job == nullptr) {
      running_.fetch_sub(1);
      // A job queued after PopQueued looked, while every slot seemed taken,
      // would wait for nobody: take a slot again for it.
      if (queued_.load() == 0 || !TakeRunSlot()) return;
      continue;
    }
    RunJob(job);
    job = nullptr;
  }
}

void RequestScheduler::RunJob(Job* job) {
  Job::Next next = Job::Next::kDone;
  RunCaught([&] { next = job->Run(); });
  if (next == Job::Next::kDone) return Finish(job);
  if (eager_ == nullptr) return RunEager(job);
  eager_->Post([this, job] { RunEager(job); });
}

void RequestScheduler::RunEager(Job* job) {
  RunCaught([&] { job->RunEager(); });
  Finish(job);
}

void RequestScheduler::Finish(Job* job) {
  Finished(job->request_bytes_);
  job->Complete();
}

void RequestScheduler::Finished(int64_t request_bytes) {
  in_flight_bytes_.fetch_sub(request_bytes);
  last_progress_ns_.store(absl::ToUnixNanos(absl::Now()));
  // Sequentially consistent with AwaitIdle: either it sees no job in flight,
  // or this sees its waiter and wakes it under the lock.
  if (in_flight_.fetch_sub(1) == 1 && idle_waiters_.load() > 0) {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_.notify_all();
  }
}

absl::Duration RequestScheduler::StalledFor(absl::Time now) const {
  if (in_flight_.load() == 0) return absl::ZeroDuration();
  return std::max(absl::ZeroDuration(), now - absl::FromUnixNanos(last_progress_ns_.load()));
}

bool RequestScheduler::AwaitIdle(absl::Time deadline) {
  idle_waiters_.fetch_add(1);
  bool idle;
  {
    std::unique_lock<std::mutex> lock(idle_mu_);
    idle = idle_.wait_until(lock, absl::ToChronoTime(deadline),
                            [this] { return in_flight_.load() == 0; });
  }
  idle_waiters_.fetch_sub(1);
  return idle;
}

}  // namespace precompile::server
