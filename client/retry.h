// Retries of the calls that change nothing on the server, made by gRPC:
// RetryServiceConfig turns a RetryPolicy into the service config that
// CreateChannel gives a channel, a retry policy (gRPC's methodConfig) for
// those methods only, so that load, unload and rescan are never retried.
// gRPC then retries within the call's deadline, with the policy's backoff
// and ±20% jitter of its own; a deadline that passes between attempts ends
// the call with DEADLINE_EXCEEDED.
//
// What stays here is what gRPC's retry policy cannot do:
// - A policy belongs to a channel, not to a call, so a call that asks for
//   another attempt count than its client's (CallOptions::max_attempts) is
//   made on a channel of its own, one per count (PerAttemptCount).
// - gRPC does not say how many attempts a call made, so a call that still
//   failed with UNAVAILABLE says how many it was allowed (RetriedResult).
//
// Thread safety: free functions; PerAttemptCount is thread-safe.
#ifndef PRECOMPILE_CLIENT_RETRY_H_
#define PRECOMPILE_CLIENT_RETRY_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client_options.h"

namespace precompile::client {

// The most attempts a gRPC retry policy makes, whatever it asks for.
inline constexpr int kMaxAttempts = 5;

// The service config (JSON) under which gRPC retries UNAVAILABLE on
// inference (ModelInfer, health, metadata, model readiness, config and
// statistics, the repository index), grpc.health.v1 Check and the admin
// service's reading calls; no retry policy at all for one attempt.
// Backoffs are taken from 1 ms to 1 h and the multiplier at least 1.
// INVALID_ARGUMENT unless 1 <= policy.max_attempts <= kMaxAttempts.
absl::StatusOr<std::string> RetryServiceConfig(const RetryPolicy& policy);

// A retried call's result: `status` as an absl::Status, where an
// UNAVAILABLE that may have been retried (`max_attempts` > 1) says so:
// "... (after up to 3 attempts)".
absl::Status RetriedResult(const grpc::Status& status, int max_attempts);

// One T (a channel and the stubs on it) per attempt count: the client's own,
// given at construction, and others made by `make` the first time a call
// asks for their count, kept for the owner's life.
template <typename T>
class PerAttemptCount {
 public:
  using Make = std::function<absl::StatusOr<T>(int attempts)>;

  PerAttemptCount(int attempts, T own, Make make)
      : own_attempts_(attempts), own_(std::move(own)), make_(std::move(make)) {}

  // Errors are `make`'s.
  absl::StatusOr<const T*> Get(int attempts) {
    if (attempts == own_attempts_) return &own_;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = others_.find(attempts);
    if (it == others_.end()) {
      absl::StatusOr<T> made = make_(attempts);
      if (!made.ok()) return made.status();
      it = others_.emplace(attempts, *std::move(made)).first;
    }
    return &it->second;  // std::map does not move its values
  }

  const T& own() const { return own_; }

 private:
  const int own_attempts_;
  const T own_;
  const Make make_;
  // std::mutex, not absl::Mutex: see base/notification.h.
  std::mutex mu_;
  std::map<int, T> others_;
};

// A client's stubs: made by `stubs_on` on `channel` (or, when it is null,
// a new channel to options.address) for the client's own attempt count, and
// on a channel of their own for any other count a call asks for. Errors are
// CreateChannel's.
template <typename Stubs>
absl::StatusOr<std::unique_ptr<PerAttemptCount<Stubs>>> StubsPerAttemptCount(
    const ClientOptions& options, std::shared_ptr<grpc::Channel> channel,
    Stubs (*stubs_on)(std::shared_ptr<grpc::Channel>)) {
  if (channel == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> created = CreateChannel(options);
    if (!created.ok()) return created.status();
    channel = *std::move(created);
  }
  return std::make_unique<PerAttemptCount<Stubs>>(
      options.retry.max_attempts, stubs_on(std::move(channel)),
      [options, stubs_on](int attempts) -> absl::StatusOr<Stubs> {
        absl::StatusOr<std::shared_ptr<grpc::Channel>> other = CreateChannel(options, attempts);
        if (!other.ok()) return other.status();
        return stubs_on(*std::move(other));
      });
}

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_RETRY_H_
