#include "server/scheduling/request_scheduler.h"

#include <algorithm>

#include "absl/algorithm/container.h"
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

RequestScheduler::~RequestScheduler() {
  std::thread timer;
  std::vector<std::vector<Job*>> left;
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    stopping_ = true;
    timer = std::move(batch_timer_);
    for (auto& [key, open] : open_batches_) left.push_back(std::move(open.members));
    open_batches_.clear();
    BatchesChanged();
  }
  batch_changed_.notify_all();
  if (timer.joinable()) timer.join();
  for (std::vector<Job*>& batch : left) {
    batch_waiting_.fetch_sub(static_cast<int>(batch.size()));
    RunBatch(std::move(batch));
  }
  eager_.reset();
}

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
  job->queued_ns_ = absl::ToUnixNanos(absl::Now());
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

RequestScheduler::Job* RequestScheduler::PopWork(std::vector<Job*>& batch) {
  if (!AnyBatchDue()) return PopQueued();
  int64_t head_ns = INT64_MAX;
  if (queued_.load() > 0) {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!queue_.empty()) head_ns = queue_.front()->queued_ns_;
  }
  if (TakeDueBatch(head_ns, batch)) return nullptr;
  return PopQueued();
}

void RequestScheduler::RunWhileWork(Job* job) {
  std::vector<Job*> batch;
  while (true) {
    if (job == nullptr) job = PopWork(batch);
    if (!batch.empty()) {
      RunBatch(std::move(batch));
      batch.clear();
      continue;
    }
    if (job == nullptr) {
      running_.fetch_sub(1);
      // Work queued, or a batch come due, after PopWork looked, while every
      // slot seemed taken, would wait for nobody: take a slot again for it.
      if ((queued_.load() == 0 && !AnyBatchDue()) || !TakeRunSlot()) return;
      continue;
    }
    RunJob(job);
    job = nullptr;
  }
}

void RequestScheduler::RunJob(Job* job) {
  Job::Next next = Job::Next::kDone;
  RunCaught([&] { next = job->Run(); });
  if (next != Job::Next::kBatch) return Continue(job, next);
  for (std::vector<Job*>& batch : JoinBatch(job)) RunBatch(std::move(batch));
}

void RequestScheduler::Continue(Job* job, Job::Next next) {
  if (next != Job::Next::kEager) return Finish(job);
  if (eager_ == nullptr) return RunEager(job);
  eager_->Post([this, job] { RunEager(job); });
}

std::vector<std::vector<RequestScheduler::Job*>> RequestScheduler::JoinBatch(Job* job) {
  std::vector<std::vector<Job*>> ready;
  const BatchTicket* ticket = job->batch_ticket();
  if (ticket == nullptr) {
    spdlog::error("event=job_without_batch_ticket");
    Finish(job);
    return ready;
  }
  const int64_t now = absl::ToUnixNanos(absl::Now());
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    if (!batch_timer_.joinable() && !stopping_) {
      batch_timer_ = std::thread([this] { TimeBatches(); });
    }
    auto take = [&](OpenBatch& open) {
      batch_waiting_.fetch_sub(static_cast<int>(open.members.size()));
      ready.push_back(std::move(open.members));
      open = OpenBatch{};
    };
    OpenBatch& open = open_batches_[ticket->key];
    // A request that would make the batch too large runs it as it is, and
    // opens the next.
    if (!open.members.empty() && open.rows + ticket->rows > ticket->max_rows) take(open);
    if (open.members.empty()) {
      open.opened_ns = now;
      open.due_ns = no_batch_delay_ ? now : now + absl::ToInt64Nanoseconds(ticket->max_delay);
      notify = true;
    }
    if (ticket->deadline < absl::InfiniteFuture()) {
      open.due_ns = std::min(open.due_ns, absl::ToUnixNanos(ticket->deadline));
      notify = true;
    }
    open.members.push_back(job);
    open.rows += ticket->rows;
    batch_waiting_.fetch_add(1);
    // A preferred size is worth running now only if nothing queued might
    // still join: queued requests join when a slot pops them, one by one.
    if (open.rows >= ticket->full_rows ||
        (queued_.load() == 0 && absl::c_linear_search(ticket->preferred_rows, open.rows))) {
      take(open);
    }
    if (open.members.empty()) open_batches_.erase(ticket->key);
    // A batch that left may have been the earliest due; one that came or
    // got an earlier deadline only moves the earliest forward.
    if (!ready.empty()) {
      BatchesChanged();
    } else if (open.due_ns < earliest_due_ns_.load()) {
      earliest_due_ns_.store(open.due_ns);
    }
  }
  if (notify) batch_changed_.notify_all();
  return ready;
}

void RequestScheduler::StopWaitingForBatches() {
  {
    std::lock_guard<std::mutex> lock(batch_mu_);
    no_batch_delay_ = true;
    const int64_t now = absl::ToUnixNanos(absl::Now());
    for (auto& [key, open] : open_batches_) open.due_ns = std::min(open.due_ns, now);
    BatchesChanged();
  }
  batch_changed_.notify_all();
}

void RequestScheduler::BatchesChanged() {
  int64_t earliest = INT64_MAX;
  for (const auto& [key, open] : open_batches_) earliest = std::min(earliest, open.due_ns);
  earliest_due_ns_.store(earliest);
}

bool RequestScheduler::AnyBatchDue() const {
  const int64_t due = earliest_due_ns_.load();
  return due != INT64_MAX && due <= absl::ToUnixNanos(absl::Now());
}

bool RequestScheduler::TakeDueBatch(int64_t before_ns, std::vector<Job*>& batch) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  std::lock_guard<std::mutex> lock(batch_mu_);
  auto first = open_batches_.end();
  for (auto it = open_batches_.begin(); it != open_batches_.end(); ++it) {
    const OpenBatch& open = it->second;
    if (open.due_ns > now || open.opened_ns >= before_ns) continue;
    if (first == open_batches_.end() || open.opened_ns < first->second.opened_ns) first = it;
  }
  if (first == open_batches_.end()) {
    // Every path that takes a batch recomputes the earliest due; recomputed
    // here too, a mistake there cannot leave every slot's thread and the
    // timer looking for a due batch that is not there, for ever.
    BatchesChanged();
    return false;
  }
  batch = std::move(first->second.members);
  batch_waiting_.fetch_sub(static_cast<int>(batch.size()));
  open_batches_.erase(first);
  BatchesChanged();
  return true;
}

void RequestScheduler::TimeBatches() {
  std::unique_lock<std::mutex> lock(batch_mu_);
  while (!stopping_) {
    const int64_t due = earliest_due_ns_.load();
    if (due == INT64_MAX) {
      batch_changed_.wait(lock);
      continue;
    }
    if (absl::ToUnixNanos(absl::Now()) < due) {
      batch_changed_.wait_until(lock, absl::ToChronoTime(absl::FromUnixNanos(due)));
      continue;
    }
    lock.unlock();
    const bool ran = TakeRunSlot();
    if (ran) RunWhileWork(nullptr);
    lock.lock();
    // Every slot is busy: a slot's thread takes the batch when it finishes
    // its job. Look again a little later all the same.
    if (!ran && !stopping_) batch_changed_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

void RequestScheduler::RunBatch(std::vector<Job*> members) {
  std::vector<Job::Next> next(members.size(), Job::Next::kDone);
  RunCaught([&] { members.front()->RunBatch(members, absl::MakeSpan(next)); });
  for (size_t i = 0; i < members.size(); ++i) Continue(members[i], next[i]);
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
