#include "server/eager_executor.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "spdlog/spdlog.h"

namespace precompile::server {
namespace {

// setpriority on a thread id changes that thread alone (Linux: a thread is
// a task with its own nice value).
void LowerThisThread(int nice) {
  if (nice == 0) return;
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && setpriority(PRIO_PROCESS, tid, current + nice) == 0) return;
  static std::atomic<bool> logged{false};
  if (!logged.exchange(true)) {
    spdlog::warn("event=eager_priority_refused nice={} error=\"{}\": eager misses run at "
                 "the priority of requests",
                 nice, std::strerror(errno));
  }
}

}  // namespace

EagerExecutor::EagerExecutor(int threads, int nice, RequestScheduler& scheduler)
    : scheduler_(scheduler), nice_(nice) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

EagerExecutor::~EagerExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_given_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void EagerExecutor::Run(absl::FunctionRef<void()> work) {
  Task task{work};
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(&task);
  }
  work_given_.notify_one();
  scheduler_.RunQueuedUntil(task.done);
  if (task.thrown) std::rethrow_exception(task.thrown);
}

void EagerExecutor::Loop() {
  LowerThisThread(nice_);
  while (true) {
    Task* task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_given_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // Stopping, and nothing left to run.
      task = tasks_.front();
      tasks_.pop_front();
    }
    try {
      task->work();
    } catch (...) {
      task->thrown = std::current_exception();
    }
    // The waiter may return, and `task` go, as soon as it sees `done`.
    task->done.store(true);
    scheduler_.NotifyWaiters();
  }
}

}  // namespace precompile::server
