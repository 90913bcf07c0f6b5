// A one-shot event that threads can wait for, like absl::Notification.
//
// The project uses std::mutex rather than absl::Mutex: Debian's abseil is
// not built with ThreadSanitizer, so its locks are invisible to
// --config=tsan and every access they guard would be reported as a race.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_BASE_NOTIFICATION_H_
#define PRECOMPILE_BASE_NOTIFICATION_H_

#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace precompile {

class Notification {
 public:
  // REQUIRES: called at most once.
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      notified_ = true;
    }
    cv_.notify_all();
  }

  bool HasBeenNotified() const {
    std::lock_guard<std::mutex> lock(mu_);
    return notified_;
  }

  void WaitForNotification() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return notified_; });
  }

  // True if notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return notified_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool notified_ = false;
};

}  // namespace precompile

#endif  // PRECOMPILE_BASE_NOTIFICATION_H_
