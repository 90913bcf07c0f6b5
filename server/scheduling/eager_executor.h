// Threads of their own for eager misses, below the priority of the threads
// that run requests.
//
// A variant hit is the service a model was captured for; an eager miss is
// its fallback, and a slow one: a Python eager program costs several hits'
// worth of CPU. On a busy server, misses run at the same priority as hits
// and ahead of them in the run queue made the hits wait (bench/RESULTS.md,
// section 6f). The request scheduler (server/scheduling/request_scheduler.h) hands a
// request whose entry frame misses to these threads, whose nice value is
// raised by `nice`, so the kernel runs the hits' threads first when cores
// are short and the misses with the cores hits leave over.
//
// A nice value, once raised, cannot be lowered again without privileges
// (RLIMIT_NICE is 0 in most containers): hence threads of their own rather
// than lowering a request's thread for the duration of its miss.
//
// Thread safety: Post may be called concurrently; the destructor runs the
// work already given and joins the threads.
#ifndef PRECOMPILE_SERVER_SCHEDULING_EAGER_EXECUTOR_H_
#define PRECOMPILE_SERVER_SCHEDULING_EAGER_EXECUTOR_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"

namespace precompile::server {

class EagerExecutor {
 public:
  // REQUIRES: threads >= 1, 0 <= nice <= 19. A nice value the system
  // refuses is logged once; the threads then run at the process's priority.
  EagerExecutor(int threads, int nice);
  ~EagerExecutor();
  EagerExecutor(const EagerExecutor&) = delete;
  EagerExecutor& operator=(const EagerExecutor&) = delete;

  // Runs `work` on one of the executor's threads, in the order given, and
  // returns at once. `work` should not throw: what it throws is logged and
  // dropped, and the thread goes on.
  void Post(absl::AnyInvocable<void() &&> work);

  // Work given and not yet started.
  int queued() const { return queued_.load(); }

 private:
  void Loop();

  const int nice_;
  std::mutex mu_;
  std::condition_variable work_given_;
  std::deque<absl::AnyInvocable<void() &&>> work_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> queued_{0};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SCHEDULING_EAGER_EXECUTOR_H_
