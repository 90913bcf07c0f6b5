// Threads of their own for eager misses, below the priority of the threads
// that run requests.
//
// A variant hit is the service a model was captured for; an eager miss is
// its fallback, and a slow one: a Python eager program costs several hits'
// worth of CPU. On a busy server, misses run at the same priority as hits
// and ahead of them in the run queue made the hits wait (bench/RESULTS.md,
// section 6f). Here the entry frame's eager program runs on one of these
// threads, whose nice value is raised by `nice`, so the kernel runs the
// hits' threads first when cores are short and the misses with the cores
// hits leave over; the request's own thread keeps its run slot and runs the
// queued requests meanwhile (RequestScheduler::RunQueuedUntil).
//
// A nice value, once raised, cannot be lowered again without privileges
// (RLIMIT_NICE is 0 in most containers): hence threads of their own rather
// than lowering the request's thread for the duration of the miss.
//
// Thread safety: Run may be called concurrently; the destructor waits for
// work already given and joins the threads.
#ifndef PRECOMPILE_SERVER_EAGER_EXECUTOR_H_
#define PRECOMPILE_SERVER_EAGER_EXECUTOR_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "server/request_scheduler.h"

namespace precompile::server {

class EagerExecutor {
 public:
  // REQUIRES: threads >= 1, 0 <= nice <= 19. A nice value the system
  // refuses is logged once; the threads then run at the process's priority.
  EagerExecutor(int threads, int nice, RequestScheduler& scheduler);
  ~EagerExecutor();
  EagerExecutor(const EagerExecutor&) = delete;
  EagerExecutor& operator=(const EagerExecutor&) = delete;

  // Runs `work` on one of the executor's threads, in the order given, and
  // returns once it has returned (what it wrote is then visible here).
  // Meanwhile the calling thread runs the scheduler's queued jobs. What
  // `work` throws is thrown here, on the calling thread, where the request
  // it belongs to can answer it; the executor's thread goes on.
  // REQUIRES: called from a job of `scheduler`.
  void Run(absl::FunctionRef<void()> work);

 private:
  struct Task {
    absl::FunctionRef<void()> work;
    std::exception_ptr thrown;
    std::atomic<bool> done{false};
  };
  void Loop();

  RequestScheduler& scheduler_;
  const int nice_;
  std::mutex mu_;
  std::condition_variable work_given_;
  std::deque<Task*> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_EAGER_EXECUTOR_H_
