// The retry decisions of one call under a RetryPolicy: whether the status of
// an attempt allows another one, and how long to wait before it
// (exponential backoff with jitter, bounded by attempts and the deadline).
// Shared by the synchronous calls and the asynchronous Infer.
//
// Thread safety: a RetryState belongs to one call; not thread-safe.
#ifndef PRECOMPILE_CLIENT_RETRY_H_
#define PRECOMPILE_CLIENT_RETRY_H_

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client_options.h"

namespace precompile::client {

// True only for UNAVAILABLE (see RetryPolicy).
bool IsRetryableCode(grpc::StatusCode code);

class RetryState {
 public:
  // `max_attempts` < 1 counts as 1. `deadline` may be absl::InfiniteFuture().
  RetryState(const RetryPolicy& policy, int max_attempts, absl::Time deadline);

  // Records an attempt that ended with `status`. Returns the delay before
  // the next attempt, or nullopt when the call is over: it succeeded, failed
  // with a code that is not retried, used its attempts, or the deadline
  // would pass before the next attempt could start.
  std::optional<absl::Duration> OnAttemptDone(const grpc::Status& status);

  int attempts() const { return attempts_; }

  // The call's result from its last attempt's status. A retryable failure
  // says how many attempts were made ("... (gave up after 3 attempts)").
  absl::Status Result(const grpc::Status& last) const;

 private:
  const RetryPolicy policy_;
  const int max_attempts_;
  const absl::Time deadline_;
  int attempts_ = 0;
  absl::Duration next_backoff_;
  bool out_of_time_ = false;
};

// Runs `attempt` with a fresh context from `prepare` until RetryState says
// the call is over, sleeping between attempts; returns RetryState::Result.
// `prepare` sets the deadline and metadata of each attempt's context.
absl::Status CallWithRetries(const RetryPolicy& policy, int max_attempts, absl::Time deadline,
                             absl::FunctionRef<void(grpc::ClientContext&)> prepare,
                             absl::FunctionRef<grpc::Status(grpc::ClientContext&)> attempt);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_RETRY_H_
