#include "runtime/size_program.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"

namespace precompile {
namespace {

using artifact::v1::SizeProgram;
using Wide = __int128;

// Beyond this, a value is an overflow: what 64 bits hold, with room for
// one more operation between two such values to stay exact in 128 bits.
constexpr Wide kLimit = static_cast<Wide>(INT64_MAX);

// Python's floor division and modulo (the remainder takes the divisor's
// sign). REQUIRES: b != 0.
Wide FloorDiv(Wide a, Wide b) {
  Wide q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
Wide FloorMod(Wide a, Wide b) { return a - FloorDiv(a, b) * b; }

}  // namespace

SizeValue EvaluateSigned(const SizeProgram& program,
                         absl::FunctionRef<std::optional<int64_t>(int32_t symbol)> symbol_value) {
  const SizeValue unknown{SizeValue::Kind::kUnknown, 0};
  absl::InlinedVector<Wide, kMaxSizeProgramDepth> stack;
  for (const SizeProgram::Step& step : program.steps()) {
    switch (step.step_case()) {
      case SizeProgram::Step::kConstant:
        stack.push_back(step.constant());
        continue;
      case SizeProgram::Step::kSymbol: {
        const std::optional<int64_t> v = symbol_value(step.symbol());
        if (!v) return unknown;
        stack.push_back(*v);
        continue;
      }
      case SizeProgram::Step::kOp:
        break;
      default:
        return unknown;
    }
    if (stack.size() < 2) return unknown;
    const Wide b = stack.back();
    stack.pop_back();
    const Wide a = stack.back();
    Wide& result = stack.back();
    switch (step.op()) {
      case SizeProgram::ADD: result = a + b; break;
      case SizeProgram::MUL: result = a * b; break;
      case SizeProgram::FLOOR_DIV:
        if (b == 0) return unknown;
        result = FloorDiv(a, b);
        break;
      case SizeProgram::MOD:
        if (b == 0) return unknown;
        result = FloorMod(a, b);
        break;
      case SizeProgram::MAX: result = std::max(a, b); break;
      case SizeProgram::MIN: result = std::min(a, b); break;
      default: return unknown;
    }
    // Operands within 64 bits keep a sum or a product exact in 128.
    if (result > kLimit || result < -kLimit) return {SizeValue::Kind::kOverflow, 0};
  }
  if (stack.size() != 1) return unknown;
  return {SizeValue::Kind::kKnown, static_cast<int64_t>(stack.back())};
}

SizeValue EvaluateSize(const SizeProgram& program,
                       absl::FunctionRef<std::optional<int64_t>(int32_t symbol)> symbol_value) {
  const SizeValue size = EvaluateSigned(program, symbol_value);
  if (size.kind == SizeValue::Kind::kKnown && size.value < 0) return {};
  return size;
}

}  // namespace precompile
