// The distinct calls of each frame that no variant matched: what the guards
// read of them (dtype, device and sizes of tensors, values of everything
// else; never tensor data), how often, when, and why the closest variant did
// not match. A recapture replays them to cover them (docs/architecture.md,
// "Misses and recapture").
//
// Memory is bounded: each frame keeps at most `signatures_per_frame`
// signatures. A new signature arriving at a full frame evicts the least
// frequent one (the least recently seen among equals), whose calls are then
// counted as "other"; so a signature seen more often than the flood of
// one-off calls around it stays.
//
// Thread safety: all methods may be called concurrently. Record() takes the
// frame's own lock for a hash lookup and a few stores; the explanation of a
// new signature is computed before the lock is taken.
#ifndef PRECOMPILE_RUNTIME_MISS_LOG_H_
#define PRECOMPILE_RUNTIME_MISS_LOG_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/artifact.pb.h"
#include "runtime/guard_program.h"
#include "runtime/value.h"

namespace precompile {

// Why the closest variant did not match a call; empty fields when the frame
// has no variant.
struct MissExplanation {
  std::string closest_variant;
  std::string failing_guard;
};

struct MissRecord {
  artifact::v1::CallSignature call;
  uint64_t count = 0;
  absl::Time first_seen;
  absl::Time last_seen;
  Outcome outcome = Outcome::kRefused;  // kEagerFallback or kRefused.
  MissExplanation explanation;
};

struct FrameMisses {
  int frame_index = 0;
  // Most frequent first.
  std::vector<MissRecord> signatures;
  // Misses whose signatures were evicted at the bound.
  uint64_t other_calls = 0;
};

class MissLog {
 public:
  // String arguments longer than this are recorded by their first bytes:
  // a client must not be able to grow the log with long strings.
  static constexpr size_t kMaxStringBytes = 256;

  // `parameter_names[f]` names frame f's parameters, in the order of the
  // views Record() gets. signatures_per_frame 0 records nothing.
  MissLog(std::vector<std::vector<std::string>> parameter_names, int signatures_per_frame);
  MissLog(const MissLog&) = delete;
  MissLog& operator=(const MissLog&) = delete;

  // Counts a miss of frame `frame` with these arguments. `explain` runs only
  // for a signature the frame does not keep yet. Returns the number of
  // signatures the frame keeps afterwards.
  size_t Record(int frame, absl::Span<const ArgView> args, Outcome outcome,
                absl::FunctionRef<MissExplanation()> explain, absl::Time now);

  // Frames with at least one miss, in frame order.
  std::vector<FrameMisses> Snapshot() const;

  int signatures_per_frame() const { return signatures_per_frame_; }
  // The bytes the kept signatures occupy (keys, explanations, table slots):
  // what the bound bounds.
  size_t MemoryBytes() const;

 private:
  struct Entry {
    uint64_t count = 0;
    absl::Time first_seen;
    absl::Time last_seen;
    Outcome outcome = Outcome::kRefused;
    MissExplanation explanation;
  };
  struct Frame {
    mutable std::mutex mu;
    absl::flat_hash_map<std::string, Entry> entries;
    uint64_t other_calls = 0;
  };

  const std::vector<std::vector<std::string>> parameter_names_;
  const int signatures_per_frame_;
  std::vector<std::unique_ptr<Frame>> frames_;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_MISS_LOG_H_
