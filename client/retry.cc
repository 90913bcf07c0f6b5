#include "client/retry.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace precompile::client {
namespace {

// One generator per thread, seeded once: jitter needs to differ between
// clients, not to be unpredictable.
double UniformJitterFactor(double jitter) {
  thread_local std::minstd_rand rng(std::random_device{}());
  jitter = std::clamp(jitter, 0.0, 1.0);
  std::uniform_real_distribution<double> factor(1.0 - jitter, 1.0 + jitter);
  return factor(rng);
}

}  // namespace

bool IsRetryableCode(grpc::StatusCode code) { return code == grpc::StatusCode::UNAVAILABLE; }

RetryState::RetryState(const RetryPolicy& policy, int max_attempts, absl::Time deadline)
    : policy_(policy),
      max_attempts_(std::max(1, max_attempts)),
      deadline_(deadline),
      next_backoff_(policy.initial_backoff) {}

std::optional<absl::Duration> RetryState::OnAttemptDone(const grpc::Status& status) {
  ++attempts_;
  if (status.ok() || !IsRetryableCode(status.error_code()) || attempts_ >= max_attempts_) {
    return std::nullopt;
  }
  const absl::Duration delay =
      std::min(next_backoff_, policy_.max_backoff) * UniformJitterFactor(policy_.jitter);
  next_backoff_ = std::min(next_backoff_ * std::max(1.0, policy_.multiplier), policy_.max_backoff);
  if (absl::Now() + delay >= deadline_) {
    out_of_time_ = true;
    return std::nullopt;
  }
  return delay;
}

absl::Status RetryState::Result(const grpc::Status& last) const {
  absl::Status status = FromGrpcStatus(last);
  if (status.ok() || !IsRetryableCode(last.error_code()) || (attempts_ <= 1 && !out_of_time_)) {
    return status;
  }
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), " (gave up after ", attempts_,
                   attempts_ == 1 ? " attempt" : " attempts",
                   out_of_time_ ? ": the deadline leaves no time for another)" : ")"));
}

absl::Status CallWithRetries(const RetryPolicy& policy, int max_attempts, absl::Time deadline,
                             absl::FunctionRef<void(grpc::ClientContext&)> prepare,
                             absl::FunctionRef<grpc::Status(grpc::ClientContext&)> attempt) {
  RetryState state(policy, max_attempts, deadline);
  while (true) {
    grpc::ClientContext context;  // a context serves one attempt only
    prepare(context);
    const grpc::Status status = attempt(context);
    std::optional<absl::Duration> delay = state.OnAttemptDone(status);
    if (!delay) return state.Result(status);
    absl::SleepFor(*delay);
  }
}

}  // namespace precompile::client
