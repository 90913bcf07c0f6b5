#include "server/repository/model_recorder.h"

namespace precompile::server {

const char* RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kVariant: return "variant";
    case RequestOutcome::kEagerFallback: return "eager_fallback";
    case RequestOutcome::kRefused: return "refused";
    case RequestOutcome::kInvalid: return "invalid";
    case RequestOutcome::kOverloaded: return "overloaded";
    case RequestOutcome::kCancelled: return "cancelled";
    case RequestOutcome::kError: return "error";
  }
  return "unknown";
}

}  // namespace precompile::server
