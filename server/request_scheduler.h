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
// number of model calls at once, besides the eager misses (below).
//
// While a slot is free a request costs a few atomic operations; the queue's
// lock is taken only when every slot is busy.
//
// A request whose entry frame misses and runs its eager program is slower
// than a hit, often by far. It gives its run slot back as soon as it knows:
// Run() says so, and the scheduler hands the rest of the job (RunEager) to
// its eager threads (server/eager_executor.h), a pool of their own below
// the hits' priority, which answers it. The slot's thread goes on with the
// queued requests. So a hit never queues behind a miss, a miss never waits
// inside another, and no thread waits for a miss holding a slot.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_
#define PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/eager_executor.h"

namespace precompile::server {

// A scheduler's eager threads: how many (0: none, and misses run on their
// run slot) and how much their nice value is raised (0 to 19).
struct EagerThreads {
  int threads = 0;
  int nice = 0;
};

class RequestScheduler {
 public:
  // One admitted request. Run() does the work on a run slot and says what
  // follows: kDone, or kEager when the rest is an eager miss, which
  // RunEager() then does on an eager thread (on the same thread, still
  // holding the slot, when the scheduler has no eager threads). Complete()
  // follows on the thread that did the last part once the job no longer
  // counts as in flight, and sends the result: so a client that has its
  // answer can be admitted again at once. The job may delete itself in
  // Complete(): the scheduler does not touch it afterwards.
  //
  // Run() and RunEager() should not throw. If one does, the scheduler logs
  // what it threw, and the job still leaves the in-flight count, gives back
  // its run slot and is Complete()d: so a job must hold a failed answer
  // from its start (an internal error) until it gives it a real one.
  class Job {
   public:
    enum class Next { kDone, kEager };
    virtual Next Run() = 0;
    virtual void RunEager() {}
    virtual void Complete() = 0;

   protected:
    ~Job() = default;

   private:
    friend class RequestScheduler;
    int64_t request_bytes_ = 0;  // What it counts against max_in_flight_bytes.
  };

  // REQUIRES: run_slots >= 1, max_in_flight >= 0, max_in_flight_bytes >= 0.
  RequestScheduler(int run_slots, int max_in_flight, int64_t max_in_flight_bytes = 0,
                   EagerThreads eager = {});
  // Runs the eager misses already handed over, then joins their threads.
  ~RequestScheduler();
  RequestScheduler(const RequestScheduler&) = delete;
  RequestScheduler& operator=(const RequestScheduler&) = delete;

  // Admits `job`, a request of `request_bytes`, and runs it now (the calling
  // thread may then run queued jobs too) or queues it. Past a limit it runs
  // nothing and returns what the request is answered: RESOURCE_EXHAUSTED,
  // naming the limit.
  absl::Status Submit(Job* job, int64_t request_bytes = 0);

  // Waits until no job is in flight, or until `deadline`: true if none is.
  bool AwaitIdle(absl::Time deadline);

  // How long jobs have been in flight without any finishing (zero while
  // none is in flight): a server whose jobs stop finishing is not live.
  absl::Duration StalledFor(absl::Time now) const;

  // Jobs admitted and not yet Complete()d, eager misses included.
  int in_flight() const { return in_flight_.load(); }
  int64_t in_flight_bytes() const { return in_flight_bytes_.load(); }
  int64_t max_in_flight_bytes() const { return max_in_flight_bytes_; }
  int queued() const { return queued_.load(); }
  // Eager misses handed over and not yet started on an eager thread.
  int eager_queued() const { return eager_ ? eager_->queued() : 0; }
  int max_in_flight() const { return max_in_flight_; }
  int run_slots() const { return run_slots_; }

 private:
  bool TakeRunSlot();
  Job* PopQueued();
  // Holding a run slot: runs `job` (if not null), then queued jobs while
  // there are any, and gives the slot back.
  void RunWhileWork(Job* job);
  // Runs `job` through Run() and, unless the rest goes to an eager thread,
  // Finish().
  void RunJob(Job* job);
  // RunEager() and Finish(), whatever RunEager throws.
  void RunEager(Job* job);
  // Finished() and Complete().
  void Finish(Job* job);
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
  // AwaitIdle's waiters: the last job out takes the lock to wake them only
  // when there are some.
  std::atomic<int> idle_waiters_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_;
  // Last, so that it is destroyed first: its threads' work ends jobs, which
  // uses the members above.
  std::unique_ptr<EagerExecutor> eager_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REQUEST_SCHEDULER_H_
