#include "runtime/value.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace precompile {

absl::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kVariant: return "variant";
    case Outcome::kEagerFallback: return "eager_fallback";
    case Outcome::kRefused: return "refused";
    case Outcome::kError: return "error";
  }
  return "unknown";
}

absl::Status UnknownArgumentError(absl::string_view model, absl::string_view name,
                                  absl::string_view arguments) {
  return absl::InvalidArgumentError(absl::StrCat(
      "model '", model, "' has no argument '", name, "' (its arguments: ", arguments,
      "): a served model takes the arguments its example calls passed, each other one at its "
      "default"));
}

absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape, uint64_t element_size,
                                      absl::string_view what) {
  constexpr uint64_t kMaxBytes = uint64_t{1} << 62;
  const uint64_t per_element = std::max<uint64_t>(element_size, 1);
  uint64_t spanned = 1;  // The sizes' product, zeros counted as ones.
  bool empty = false;
  for (const int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, " has a negative dimension in shape [",
                                                     absl::StrJoin(shape, ", "), "]"));
    }
    const uint64_t size = std::max<uint64_t>(static_cast<uint64_t>(d), 1);
    if (spanned > kMaxBytes / per_element / size) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has shape [", absl::StrJoin(shape, ", "),
                       "], more elements than any request can carry"));
    }
    spanned *= size;
    empty = empty || d == 0;
  }
  return empty ? 0 : spanned;
}

}  // namespace precompile
