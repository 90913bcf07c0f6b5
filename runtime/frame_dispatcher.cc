#include "runtime/frame_dispatcher.h"

#include <utility>

namespace precompile {

FrameDispatcher::FrameDispatcher(std::vector<GuardProgram> variants)
    : variants_(std::move(variants)) {}

int FrameDispatcher::Match(absl::Span<const ArgView> args,
                           const GlobalState& state) const {
  const int n = static_cast<int>(variants_.size());
  if (n == 0) return -1;
  const int last = last_hit_.load(std::memory_order_relaxed);
  if (variants_[last].Matches(args, state)) return last;
  for (int i = 0; i < n; ++i) {
    if (i != last && variants_[i].Matches(args, state)) {
      last_hit_.store(i, std::memory_order_relaxed);
      return i;
    }
  }
  return -1;
}

std::optional<FrameDispatcher::Explanation> FrameDispatcher::ExplainMiss(
    absl::Span<const ArgView> args, const GlobalState& state) const {
  // The closest variant is one that takes the inputs the call sent, or the
  // most of them (a call without a cache is a prefill, however far a decode
  // variant's checks get before they find the cache missing), and among
  // those the one whose first failing check comes latest; only its mismatch is put in
  // words (a refusal storm on a frame with many variants would otherwise
  // build a reason per variant per request). On a tie, the later one:
  // Dynamo recompiles a frame with the sizes that missed made dynamic, so
  // later variants are the more general, and their ranges say what the
  // frame takes.
  int closest = -1;
  int closest_differ = 0;
  int closest_held = -1;
  for (int i = 0; i < static_cast<int>(variants_.size()); ++i) {
    const int held = variants_[i].ChecksHeld(args, state);
    if (held == variants_[i].num_checks()) continue;  // Holds: no mismatch.
    const int differ = variants_[i].InputsNotAsTaken(args);
    if (closest >= 0 && differ > closest_differ) continue;
    if (closest < 0 || differ < closest_differ || held >= closest_held) {
      closest_differ = differ;
      closest_held = held;
      closest = i;
    }
  }
  if (closest < 0) return std::nullopt;
  std::optional<GuardProgram::Mismatch> m = variants_[closest].ExplainMismatch(args, state);
  return Explanation{closest, std::move(m->reason)};
}

}  // namespace precompile
