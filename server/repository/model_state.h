// The state of one model of the repository, as operators and health checks
// see it.
#ifndef PRECOMPILE_SERVER_REPOSITORY_MODEL_STATE_H_
#define PRECOMPILE_SERVER_REPOSITORY_MODEL_STATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/repository/repository_policy.h"

namespace precompile::server {

struct BatchingConfig;  // server/scheduling/dynamic_batching.h
struct SequenceConfig;  // server/scheduling/sequence_state.h

// config.pbtxt's instance_group: how many instances of each variant run at
// once (Triton's count, summed over the groups) and the device kind they
// ask for.
struct InstanceGroups {
  enum class Kind { kAny, kCpu, kGpu };
  int count = 0;  // 0: the server's --runners_per_variant.
  Kind kind = Kind::kAny;
};

struct ModelState {
  enum class Phase { kUnavailable, kLoading, kReady, kUnloading };
  std::string name;
  // The newest version served, which requests naming no version get; 0
  // when none.
  int64_t version = 0;
  // Every version served, newest first (as the version policy asks).
  std::vector<int64_t> versions;
  Phase phase = Phase::kUnavailable;
  std::string reason;  // Why the last load failed, or why it is not served.
  std::string directory;  // The newest served version's.
  VersionPolicy policy;
  // The model's own limit on a request's time (config.pbtxt's parameter
  // max_request_seconds; infinite for "0"), in place of the server's.
  std::optional<absl::Duration> max_request_time;
  // Its batching (max_batch_size and dynamic_batching); null for none.
  std::shared_ptr<const BatchingConfig> batching;
  // The state its sequences keep (sequence_batching); null for none.
  std::shared_ptr<const SequenceConfig> sequences;
  InstanceGroups instances;
  // Its last load failed and no version of it is served.
  bool failed = false;
};

inline const char* PhaseName(ModelState::Phase phase) {
  switch (phase) {
    case ModelState::Phase::kUnavailable: return "UNAVAILABLE";
    case ModelState::Phase::kLoading: return "LOADING";
    case ModelState::Phase::kReady: return "READY";
    case ModelState::Phase::kUnloading: return "UNLOADING";
  }
  return "UNKNOWN";
}

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_MODEL_STATE_H_
