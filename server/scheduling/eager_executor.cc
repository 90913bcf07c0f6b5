#include "server/scheduling/eager_executor.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/log_text.h"
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

EagerExecutor::EagerExecutor(int threads, int nice) : nice_(nice) {
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

void EagerExecutor::Post(absl::AnyInvocable<void() &&> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_.push_back(std::move(work));
    queued_.fetch_add(1);
  }
  work_given_.notify_one();
}

void EagerExecutor::Loop() {
  LowerThisThread(nice_);
  while (true) {
    absl::AnyInvocable<void() &&> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_given_.wait(lock, [this] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;  // Stopping, and nothing left to run.
      work = std::move(work_.front());
      work_.pop_front();
      queued_.fetch_sub(1);
    }
    try {
      std::move(work)();
    } catch (...) {
      spdlog::error("event=eager_work_threw what=\"{}\"", DescribeCaughtException().what);
    }
  }
}

}  // namespace precompile::server
