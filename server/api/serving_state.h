// What the services share about the server as a whole: whether it is live
// (its requests make progress) and ready (the repository's first load is
// done and it is not draining). Admission is the request scheduler's
// (server/scheduling/request_scheduler.h).
//
// Thread safety: all methods may be called concurrently; they are lock-free.
#ifndef PRECOMPILE_SERVER_API_SERVING_STATE_H_
#define PRECOMPILE_SERVER_API_SERVING_STATE_H_

#include <atomic>

namespace precompile::server {

class ServingState {
 public:
  // Ready: the repository's first scan is done, the server is not draining,
  // and (with strict readiness) no model is loading or failed to load.
  bool ready() const {
    return ready_.load() && !draining_.load() && live() && (!strict_ || models_ok_.load());
  }
  // Not live: requests are in flight and none has finished for longer than
  // any should take, or the accelerator is lost (runtime/device_health.h);
  // the orchestrator should restart the server.
  bool live() const { return !stalled_.load() && !device_lost_.load(); }
  void SetStalled(bool stalled) { stalled_.store(stalled); }
  void SetDeviceLost() { device_lost_.store(true); }
  bool draining() const { return draining_.load(); }
  void SetReady() { ready_.store(true); }
  void SetStrict(bool strict) { strict_ = strict; }
  void SetModelsOk(bool ok) { models_ok_.store(ok); }
  void BeginDrain() { draining_.store(true); }

 private:
  bool strict_ = true;
  std::atomic<bool> ready_{false};
  std::atomic<bool> models_ok_{true};
  std::atomic<bool> draining_{false};
  std::atomic<bool> stalled_{false};
  std::atomic<bool> device_lost_{false};
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_SERVING_STATE_H_
