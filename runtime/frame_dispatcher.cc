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
  std::optional<Explanation> best;
  int best_passed = -1;
  for (int i = 0; i < static_cast<int>(variants_.size()); ++i) {
    std::optional<GuardProgram::Mismatch> m =
        variants_[i].ExplainMismatch(args, state);
    if (!m) continue;  // This variant holds: not part of the explanation.
    if (m->checks_passed > best_passed) {
      best_passed = m->checks_passed;
      best = Explanation{i, std::move(m->reason)};
    }
  }
  return best;
}

}  // namespace precompile
