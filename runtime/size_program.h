// Evaluates a SizeProgram (proto/artifact.proto): an output dimension's
// size as an expression of size symbols, recorded by the capture, computed
// here from a call's argument sizes before the variant runs.
//
// The arithmetic is exact in 128 bits: a result past what 64 bits hold is
// kOverflow (a caller checking sizes treats it as too large), never a
// wrapped value an attacker could pick.
#ifndef PRECOMPILE_RUNTIME_SIZE_PROGRAM_H_
#define PRECOMPILE_RUNTIME_SIZE_PROGRAM_H_

#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "proto/artifact.pb.h"

namespace precompile {

struct SizeValue {
  enum class Kind {
    kKnown,     // `value` is the size.
    kUnknown,   // A symbol without a value, a malformed program, a division
                // by zero, or a negative result.
    kOverflow,  // Larger than 2^63 - 1 somewhere along the way.
  };
  Kind kind = Kind::kUnknown;
  int64_t value = 0;
};

// `symbol_value` gives a symbol's value, or nullopt when it is not known.
SizeValue EvaluateSize(const artifact::v1::SizeProgram& program,
                       absl::FunctionRef<std::optional<int64_t>(int32_t symbol)> symbol_value);

// Programs that hold at most this many values at once are evaluated without
// allocating.
inline constexpr int kMaxSizeProgramDepth = 16;

// The same for one side of a relation between sizes (SizeRelation), whose
// value may be negative (a difference of sizes).
SizeValue EvaluateSigned(const artifact::v1::SizeProgram& program,
                         absl::FunctionRef<std::optional<int64_t>(int32_t symbol)> symbol_value);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_SIZE_PROGRAM_H_
