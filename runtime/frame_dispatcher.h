// Picks the variant of one frame whose guards hold for a call.
//
// Thread safety: Match() and ExplainMiss() may be called concurrently. The
// only shared mutable state is the index of the most recently hit variant,
// an atomic that is written only when it changes.
#ifndef PRECOMPILE_RUNTIME_FRAME_DISPATCHER_H_
#define PRECOMPILE_RUNTIME_FRAME_DISPATCHER_H_

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "runtime/guard_program.h"

namespace precompile {

class FrameDispatcher {
 public:
  explicit FrameDispatcher(std::vector<GuardProgram> variants);
  FrameDispatcher(const FrameDispatcher&) = delete;
  FrameDispatcher& operator=(const FrameDispatcher&) = delete;

  // The index of a variant whose guards hold, or -1. The most recently hit
  // variant is tried first (calls tend to repeat their shapes), then the
  // others in capture order. Allocates nothing.
  int Match(absl::Span<const ArgView> args, const GlobalState& state) const;

  struct Explanation {
    int variant = -1;    // The closest variant.
    std::string reason;  // Its first failing guard, in words.
  };
  // For a call that Match() missed: the variant that got furthest through
  // its checks among those that take the most of the inputs the call sent
  // (a tensor where it sends one, None where it sends none), and why it
  // failed. nullopt if the frame has no variants.
  std::optional<Explanation> ExplainMiss(absl::Span<const ArgView> args,
                                         const GlobalState& state) const;

  size_t num_variants() const { return variants_.size(); }

 private:
  std::vector<GuardProgram> variants_;
  mutable std::atomic<int> last_hit_{0};
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_FRAME_DISPATCHER_H_
