#include "runtime/value.h"

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

}  // namespace precompile
