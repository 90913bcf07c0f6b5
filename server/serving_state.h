// What the services share about the server as a whole: whether it is ready
// (the repository's first load is done and it is not draining), and the
// admission of inference requests under a concurrency limit.
//
// Thread safety: all methods may be called concurrently; they are lock-free.
#ifndef PRECOMPILE_SERVER_SERVING_STATE_H_
#define PRECOMPILE_SERVER_SERVING_STATE_H_

#include <atomic>
#include <cstdint>

namespace precompile::server {

class ServingState {
 public:
  // `max_in_flight`: inference requests admitted at once; 0 means no limit.
  explicit ServingState(int max_in_flight) : max_in_flight_(max_in_flight) {}

  // Ready: the repository's first scan is done, the server is not draining,
  // and (with strict readiness) no model is loading or failed to load.
  bool ready() const {
    return ready_.load() && !draining_.load() && (!strict_ || models_ok_.load());
  }
  bool draining() const { return draining_.load(); }
  void SetReady() { ready_.store(true); }
  void SetStrict(bool strict) { strict_ = strict; }
  void SetModelsOk(bool ok) { models_ok_.store(ok); }
  void BeginDrain() { draining_.store(true); }

  // Admits one request, or returns false if the limit is reached. A true
  // result must be paired with Release().
  bool TryAdmit() {
    const int now = in_flight_.fetch_add(1) + 1;
    if (max_in_flight_ > 0 && now > max_in_flight_) {
      in_flight_.fetch_sub(1);
      return false;
    }
    return true;
  }
  void Release() { in_flight_.fetch_sub(1); }
  int in_flight() const { return in_flight_.load(); }
  int max_in_flight() const { return max_in_flight_; }

 private:
  const int max_in_flight_;
  bool strict_ = true;
  std::atomic<bool> ready_{false};
  std::atomic<bool> models_ok_{true};
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SERVING_STATE_H_
