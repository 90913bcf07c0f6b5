// Admission, run slots and the queue of inference requests, apart from the
// transports that bring them (the gRPC and the HTTP handlers each submit a
// job per inference request, with its size in bytes).
//
// A request is admitted while fewer than `max_in_flight` are in flight
// (running or queued; 0: no limit) and the bytes of the requests in flight,
// its own included, stay within `max_in_flight_bytes` (0: no limit); it is
// refused otherwise, so that a burst past a limit is answered at once instead
// of piling up, and what admitted requests hold in memory is bounded. An admitted
// request runs on the submitting thread when fewer than `run_slots` run, so
// an idle server answers on the thread that read the request; otherwise it
// waits in a FIFO queue and runs on the next thread that finishes one. A
// request holds its thread through the model call, so run_slots is the
// number of model calls at once.
//
// While a slot is free a request costs a few atomic operations; the queue's
// lock is taken only when every slot is busy.
//
// A running job whose work goes on on another thread (an eager miss on the
// eager threads, server/eager_executor.h) keeps its slot and, while it
// waits, runs the queued jobs with it (RunQueuedUntil): so a slow miss
// neither idles a slot nor makes the requests behind it wait for it.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_
#define PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace precompile::server {

class RequestScheduler {
 public:
  // One admitted request. Run() does the work; Complete() follows on the
  // same thread once the job no longer counts as in flight, and sends the
  // result: so a client that has its answer can be admitted again at once.
  // The job may delete itself in Complete(): the scheduler does not touch
  // it afterwards.
  //
  // Run() should not throw. If it does, the scheduler logs what it threw,
  // and the job still leaves the in-flight count, gives back its run slot
  // and is Complete()d: so a job must hold a failed answer from its start
  // (an internal error) until Run() gives it a real one.
  class Job {
   public:
    virtual void Run() = 0;
    virtual void Complete() = 0;

   protected:
    ~Job() = default;

   private:
    friend class RequestScheduler;
    int64_t request_bytes_ = 0;  // What it counts against max_in_flight_bytes.
  };

  // REQUIRES: run_slots >= 1, max_in_flight >= 0, max_in_flight_bytes >= 0.
  RequestScheduler(int run_slots, int max_in_flight, int64_t max_in_flight_bytes = 0);
  RequestScheduler(const RequestScheduler&) = delete;
  RequestScheduler& operator=(const RequestScheduler&) = delete;

  // Admits `job`, a request of `request_bytes`, and runs it now (the calling
  // thread may then run queued jobs too) or queues it. Past a limit it runs
  // nothing and returns what the request is answered: RESOURCE_EXHAUSTED,
  // naming the limit.
  absl::Status Submit(Job* job, int64_t request_bytes = 0);

  // For a running job that waits for its work to finish on another thread:
  // runs queued jobs on this thread, with the job's run slot, until `done`
  // is true. Whoever sets `done` calls NotifyWaiters() afterwards. A queued
  // job that started returns first, so `done` may wait for one job's run.
  // Nested waits (a job run here waits in turn) run queued jobs up to 64
  // levels deep, then only wait. REQUIRES: called from a job's Run().
  void RunQueuedUntil(const std::atomic<bool>& done);
  void NotifyWaiters();

  // Waits until no job is in flight, or until `deadline`: true if none is.
  bool AwaitIdle(absl::Time deadline);

  // How long jobs have been in flight without any finishing (zero while
  // none is in flight): a server whose jobs stop finishing is not live.
  absl::Duration StalledFor(absl::Time now) const;

  // Jobs admitted whose Run() has not returned.
  int in_flight() const { return in_flight_.load(); }
  int64_t in_flight_bytes() const { return in_flight_bytes_.load(); }
  int64_t max_in_flight_bytes() const { return max_in_flight_bytes_; }
  int queued() const { return queued_.load(); }
  int max_in_flight() const { return max_in_flight_; }
  int run_slots() const { return run_slots_; }

 private:
  bool TakeRunSlot();
  Job* PopQueued();
  // Holding a run slot: runs `job` (if not null), then queued jobs while
  // there are any, and gives the slot back.
  void RunWhileWork(Job* job);
  // Runs `job` through Run(), Finished() and Complete(), whatever Run throws.
  void RunJob(Job* job);
  void Finished(int64_t request_bytes);

  const int run_slots_;
  const int max_in_flight_;
  const int64_t max_in_flight_bytes_;
  std::atomic<int> in_flight_{0};
  std::atomic<int64_t> in_flight_bytes_{0};
  // When a job last finished, or the first of those in flight was admitted
  // (absl::ToUnixNanos).
  std::atomic<int64_t> last_progress_ns_{0};
  std::atomic<int> running_{0};
  std::atomic<int> queued_{0};
  std::mutex queue_mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(queue_mu_);
  // RunQueuedUntil's waiters, woken by a queued job or NotifyWaiters.
  int queue_waiters_ ABSL_GUARDED_BY(queue_mu_) = 0;
  std::condition_variable queue_changed_;
  // AwaitIdle's waiters: the last job out takes the lock to wake them only
  // when there are some.
  std::atomic<int> idle_waiters_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_
