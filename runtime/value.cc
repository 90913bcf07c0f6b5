#include "runtime/value.h"

#include "absl/strings/str_cat.h"

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

}  // namespace precompile
