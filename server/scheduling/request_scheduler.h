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
// its eager threads (server/scheduling/eager_executor.h), a pool of their own below
// the hits' priority, which answers it. The slot's thread goes on with the
// queued requests. So a hit never queues behind a miss, a miss never waits
// inside another, and no thread waits for a miss holding a slot.
//
// A request to a model that batches (server/scheduling/dynamic_batching.h) joins an
// open batch of requests with the same key when Run() says so (kBatch): it
// gives its slot back, like a miss, and waits there until the batch is
// full (its rows reach the ticket's full_rows, or one of its preferred_rows
// while nothing waits in the queue, as Triton cuts at a preferred batch
// size when no more requests are pending), until the batch's delay
// passes while a slot is free, or until a request that would not fit
// comes. Then one slot runs the whole batch (RunBatch). Requests queued
// before a batch opened run first, and may join it; a batch whose delay
// passed runs before those queued after it opened. So with a delay of zero
// a batch gathers what was queued when it opened, and a batch's first
// request waits at most its delay beyond the work queued before it.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_SCHEDULING_REQUEST_SCHEDULER_H_
#define PRECOMPILE_SERVER_SCHEDULING_REQUEST_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/scheduling/eager_executor.h"

namespace precompile::server {

// A scheduler's eager threads: how many (0: none, and misses run on their
// run slot) and how much their nice value is raised (0 to 19).
struct EagerThreads {
  int threads = 0;
  int nice = 0;
};

// What a request waiting for a batch says of it.
struct BatchTicket {
  // Requests with equal keys may run as one.
  std::string key;
  int64_t rows = 1;
  // The most rows a batch may have, and those at which it runs at once.
  int64_t max_rows = 1;
  int64_t full_rows = 1;
  // Rows at which it also runs at once if no request waits in the queue
  // that might still join it (the model's preferred batch sizes; they
  // outlive the request).
  absl::Span<const int64_t> preferred_rows;
  // How long the batch waits for more after its first request joined.
  absl::Duration max_delay;
  // The batch runs by then at the latest (the request's own deadline).
  absl::Time deadline = absl::InfiniteFuture();
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
  //
  // Run() may also say kBatch: the job waits for a batch, as batch_ticket()
  // then says. Once its batch runs, the first job's RunBatch(members, next)
  // runs all of them (`members`, in the order they joined, the job itself
  // first; each job's ticket had the same key) and says in `next` what
  // follows for each: kDone, or kEager as after Run().
  class Job {
   public:
    enum class Next { kDone, kEager, kBatch };
    virtual Next Run() = 0;
    virtual void RunEager() {}
    virtual const BatchTicket* batch_ticket() const { return nullptr; }
    virtual void RunBatch(absl::Span<Job* const> members, absl::Span<Next> next) {}
    virtual void Complete() = 0;

   protected:
    ~Job() = default;

   private:
    friend class RequestScheduler;
    int64_t request_bytes_ = 0;  // What it counts against max_in_flight_bytes.
    int64_t queued_ns_ = 0;  // When it entered the queue (absl::ToUnixNanos).
  };

  // REQUIRES: run_slots >= 1, max_in_flight >= 0, max_in_flight_bytes >= 0.
  RequestScheduler(int run_slots, int max_in_flight, int64_t max_in_flight_bytes = 0,
                   EagerThreads eager = {});
  // Runs the batches still open and the eager misses already handed over,
  // then joins their threads.
  ~RequestScheduler();
  RequestScheduler(const RequestScheduler&) = delete;
  RequestScheduler& operator=(const RequestScheduler&) = delete;

  // Admits `job`, a request of `request_bytes`, and runs it now (the calling
  // thread may then run queued jobs too) or queues it. Past a limit it runs
  // nothing and returns what the request is answered: RESOURCE_EXHAUSTED,
  // naming the limit.
  absl::Status Submit(Job* job, int64_t request_bytes = 0);

  // From now on no batch waits for more requests: those open are due now,
  // and later ones as they open. A draining server calls it first, so that
  // a batch's delay does not hold the drain up.
  void StopWaitingForBatches();

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
  // Requests waiting in open batches.
  int batch_waiting() const { return batch_waiting_.load(); }
  int max_in_flight() const { return max_in_flight_; }
  int run_slots() const { return run_slots_; }

 private:
  struct OpenBatch {
    std::vector<Job*> members;
    int64_t rows = 0;
    int64_t opened_ns = 0;
    int64_t due_ns = 0;  // When it runs even if not full.
  };
  bool TakeRunSlot();
  Job* PopQueued();
  // The next work for a slot: the queue's first job, or a batch that is due
  // and opened before that job was queued (then `batch` is filled).
  Job* PopWork(std::vector<Job*>& batch);
  // Holding a run slot: runs `job` (if not null), then queued work while
  // there is any, and gives the slot back.
  void RunWhileWork(Job* job);
  // Runs `job` through Run() and, unless the rest goes to an eager thread
  // or a batch, Finish().
  void RunJob(Job* job);
  // Adds `job` to its batch; returns the batches that are to run now.
  std::vector<std::vector<Job*>> JoinBatch(Job* job);
  // Runs a batch's jobs through RunBatch and what follows for each.
  void RunBatch(std::vector<Job*> members);
  // What follows Run() or RunBatch(): Finish(), or the eager part.
  void Continue(Job* job, Job::Next next);
  // Takes the due batch that opened first, if any opened before `before_ns`.
  bool TakeDueBatch(int64_t before_ns, std::vector<Job*>& batch);
  bool AnyBatchDue() const;
  // Recomputes earliest_due_ns_, after a batch left.
  void BatchesChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch_mu_);
  // The batch timer's thread: runs due batches while a slot is free.
  void TimeBatches();
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
  // Open batches by key; earliest_due_ns_ is the earliest due_ns among
  // them (INT64_MAX for none), read without the lock.
  std::mutex batch_mu_;
  absl::flat_hash_map<std::string, OpenBatch> open_batches_ ABSL_GUARDED_BY(batch_mu_);
  std::atomic<int64_t> earliest_due_ns_{INT64_MAX};
  std::atomic<int> batch_waiting_{0};
  std::condition_variable batch_changed_;
  bool stopping_ ABSL_GUARDED_BY(batch_mu_) = false;
  bool no_batch_delay_ ABSL_GUARDED_BY(batch_mu_) = false;
  // Started by the first batch.
  std::thread batch_timer_ ABSL_GUARDED_BY(batch_mu_);
  // Last, so that it is destroyed first: its threads' work ends jobs, which
  // uses the members above.
  std::unique_ptr<EagerExecutor> eager_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SCHEDULING_REQUEST_SCHEDULER_H_
