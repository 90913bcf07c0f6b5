// Threads serving calls from one gRPC completion queue, and the order in
// which they stop: once stopping begins no call is requested, the requests
// being made finish, every call requested ends, and only then is the queue
// shut down (nothing may start on a queue that is shutting down) and the
// threads joined.
//
// Also: gRPC's completion queue orders what a thread does before it hands a
// tag to gRPC and what the thread that gets the tag back does. That ordering
// lives in libgrpc, which is not built with ThreadSanitizer, so the services
// state it with HandToGrpc and TakeFromGrpc; elsewhere these are no-ops.
//
// Thread safety: RequestCall and CallEnded from any thread; Start and Stop
// from the thread that controls the server.
#ifndef PRECOMPILE_SERVER_GRPC_CALL_QUEUE_H_
#define PRECOMPILE_SERVER_GRPC_CALL_QUEUE_H_

#include <grpcpp/server_builder.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define PRECOMPILE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PRECOMPILE_TSAN 1
#endif
#endif

#ifdef PRECOMPILE_TSAN
extern "C" void __tsan_acquire(void* address);
extern "C" void __tsan_release(void* address);
#endif

namespace precompile::server {

#ifdef PRECOMPILE_TSAN
inline void HandToGrpc(void* tag) { __tsan_release(tag); }
inline void TakeFromGrpc(void* tag) { __tsan_acquire(tag); }
#else
inline void HandToGrpc(void*) {}
inline void TakeFromGrpc(void*) {}
#endif

class CallQueue {
 public:
  CallQueue() = default;
  CallQueue(const CallQueue&) = delete;
  CallQueue& operator=(const CallQueue&) = delete;

  // Takes `cq` and starts `threads` threads, each running `serve` (which
  // reads the queue until Next returns false).
  void Start(std::unique_ptr<grpc::ServerCompletionQueue> cq, int threads,
             const std::function<void()>& serve) {
    cq_ = std::move(cq);
    for (int i = 0; i < threads; ++i) threads_.emplace_back(serve);
  }
  grpc::ServerCompletionQueue* queue() const { return cq_.get(); }

  // Runs `request`, which requests one call on the queue, unless stopping
  // has begun. The call counts until CallEnded.
  template <typename Request>
  void RequestCall(Request&& request) {
    requesting_.fetch_add(1);
    if (!stopping_.load()) {
      live_calls_.fetch_add(1);
      std::forward<Request>(request)();
    }
    requesting_.fetch_sub(1);
  }
  void CallEnded() { live_calls_.fetch_sub(1); }

  // After the gRPC server has shut down, so that gRPC fails the requests no
  // call matched and the threads take every call's last event. Idempotent.
  void Stop() {
    if (!cq_ || stopped_) return;
    stopped_ = true;
    stopping_.store(true);
    while (requesting_.load() > 0) std::this_thread::yield();
    while (live_calls_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    cq_->Shutdown();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requesting_{0};
  std::atomic<int> live_calls_{0};
  bool stopped_ = false;  // Only the controlling thread calls Stop.
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_CALL_QUEUE_H_
