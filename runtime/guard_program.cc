#include "runtime/guard_program.h"

#include <cmath>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/size_program.h"

namespace precompile {
namespace {

using artifact::v1::ArgumentGuard;
using artifact::v1::Scalar;
using artifact::v1::TensorGuard;

absl::string_view KindName(ArgView::Kind kind) {
  switch (kind) {
    case ArgView::Kind::kNone: return "None";
    case ArgView::Kind::kTensor: return "a tensor";
    case ArgView::Kind::kBool: return "a bool";
    case ArgView::Kind::kInt: return "an int";
    case ArgView::Kind::kFloat: return "a float";
    case ArgView::Kind::kString: return "a string";
  }
  return "unknown";
}

std::string ValueText(const ArgView& a) {
  switch (a.kind) {
    case ArgView::Kind::kNone: return "None";
    case ArgView::Kind::kTensor: return "a tensor";
    case ArgView::Kind::kBool: return a.bool_value ? "True" : "False";
    case ArgView::Kind::kInt: return absl::StrCat(a.int_value);
    case ArgView::Kind::kFloat: return absl::StrCat(a.float_value);
    case ArgView::Kind::kString: return absl::StrCat("'", a.string_value, "'");
  }
  return "unknown";
}

// For messages only: a size symbol's bound or value shifted by an offset.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? std::numeric_limits<int64_t>::max()
               : std::numeric_limits<int64_t>::min();
}

// A dimension may be its symbol plus an offset (a mask one longer than a
// cache); offsets stay small so that no size arithmetic comes near overflow.
constexpr int64_t kMaxSymbolOffset = int64_t{1} << 31;

using artifact::v1::SizeProgram;
using artifact::v1::SizeRelation;

// The comparison that holds where `comparison` does not: a failed guard's
// sizes said as a fact ("got 81 > 64").
absl::string_view FailedComparisonText(SizeRelation::Comparison comparison) {
  switch (comparison) {
    case SizeRelation::EQ:
      return "!=";
    case SizeRelation::NE:
      return "==";
    case SizeRelation::LT:
      return ">=";
    case SizeRelation::LE:
      return ">";
    case SizeRelation::GT:
      return "<=";
    case SizeRelation::GE:
      return "<";
    default:
      return "?";
  }
}

bool Compare(int64_t a, SizeRelation::Comparison comparison, int64_t b) {
  switch (comparison) {
    case SizeRelation::EQ:
      return a == b;
    case SizeRelation::NE:
      return a != b;
    case SizeRelation::LT:
      return a < b;
    case SizeRelation::LE:
      return a <= b;
    case SizeRelation::GT:
      return a > b;
    case SizeRelation::GE:
      return a >= b;
    default:
      return false;
  }
}

// `program` with each symbol step renamed to the slot that holds its value;
// an error if a symbol has no slot, if the program does not leave exactly
// one value (an operation without its two operands), or if it holds more
// values at once than EvaluateSigned keeps without allocating.
absl::StatusOr<SizeProgram> ToSlots(const SizeProgram& program,
                                    const absl::flat_hash_map<uint32_t, uint16_t>& slots) {
  SizeProgram renamed = program;
  int depth = 0;
  for (SizeProgram::Step& step : *renamed.mutable_steps()) {
    if (depth >= kMaxSizeProgramDepth && step.step_case() != SizeProgram::Step::kOp) {
      return absl::InvalidArgumentError(
          absl::StrCat("it holds more than ", kMaxSizeProgramDepth, " values at once"));
    }
    switch (step.step_case()) {
      case SizeProgram::Step::kConstant:
        ++depth;
        break;
      case SizeProgram::Step::kSymbol: {
        const auto slot =
            step.symbol() < 0 ? slots.end() : slots.find(static_cast<uint32_t>(step.symbol()));
        if (slot == slots.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("it uses size symbol ", step.symbol(), ", which no dimension binds"));
        }
        step.set_symbol(slot->second);
        ++depth;
        break;
      }
      case SizeProgram::Step::kOp:
        if (step.op() == SizeProgram::OP_UNSPECIFIED || !SizeProgram::Op_IsValid(step.op()) ||
            depth < 2) {
          return absl::InvalidArgumentError("it has an operation without its two operands");
        }
        --depth;
        break;
      default:
        return absl::InvalidArgumentError("it has an empty step");
    }
  }
  if (depth != 1) return absl::InvalidArgumentError("a side does not compute one value");
  return renamed;
}

}  // namespace

// One pass over the variant's guards, emitting checks in the order Matches
// runs them: a size symbol's slot is numbered where the symbol first
// appears (kBindSymbol) and compared wherever it appears again
// (kSymbolEqual), so the pass keeps that numbering in one place rather than
// across helpers.
absl::StatusOr<GuardProgram> GuardProgram::Compile(
    const artifact::v1::Variant& variant,
    const std::vector<std::string>& parameter_names) {
  GuardProgram program;
  program.parameter_names_ = parameter_names;
  const std::string where = absl::StrCat("variant '", variant.id(), "'");

  if (variant.has_global_state()) {
    Check grad{Op::kGradMode};
    grad.value = variant.global_state().grad_enabled() ? 1 : 0;
    program.checks_.push_back(grad);
    std::optional<DType> dtype =
        DTypeFromProto(variant.global_state().default_dtype());
    if (!dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unknown default dtype in its global state guard"));
    }
    Check def{Op::kDefaultDType};
    def.value = static_cast<int64_t>(*dtype);
    program.checks_.push_back(def);
  }

  absl::flat_hash_map<uint32_t, const artifact::v1::SymbolRange*> ranges;
  for (const auto& range : variant.symbols()) {
    if (range.has_max() && range.max() < range.min()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: size symbol %d has an empty range [%d, %d]", where,
          range.symbol(), range.min(), range.max()));
    }
    ranges[range.symbol()] = &range;
  }
  absl::flat_hash_map<uint32_t, uint16_t> slot_of_symbol;

  for (const ArgumentGuard& guard : variant.guards()) {
    if (guard.parameter() >= parameter_names.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: a guard names parameter %d but the frame has %d", where,
          guard.parameter(), parameter_names.size()));
    }
    const auto arg = static_cast<uint16_t>(guard.parameter());
    if (guard.has_equals()) {
      const Scalar& s = guard.equals();
      Check c{Op::kIsNone, arg};
      switch (s.value_case()) {
        case Scalar::kNone: break;
        case Scalar::kBoolValue:
          c.op = Op::kBoolEquals;
          c.value = s.bool_value();
          break;
        case Scalar::kIntValue:
          c.op = Op::kIntEquals;
          c.value = s.int_value();
          break;
        case Scalar::kFloatValue:
          c.op = Op::kFloatEquals;
          c.float_value = s.float_value();
          break;
        case Scalar::kStringValue:
          c.op = Op::kStringEquals;
          c.value = static_cast<int64_t>(program.strings_.size());
          program.strings_.push_back(s.string_value());
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": the guard on '", parameter_names[arg], "' has no value"));
      }
      program.checks_.push_back(c);
      continue;
    }
    if (!guard.has_tensor()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the guard on '", parameter_names[arg], "' is empty"));
    }
    const TensorGuard& t = guard.tensor();
    if (t.is_none()) {
      program.checks_.push_back(Check{Op::kIsNone, arg});
      continue;
    }
    std::optional<DType> dtype = DTypeFromProto(t.dtype());
    std::optional<DeviceType> device = DeviceTypeFromName(t.device());
    if (!dtype || !device) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the guard on '", parameter_names[arg],
          "' has an unknown dtype or device '", t.device(), "'"));
    }
    program.checks_.push_back(Check{Op::kIsTensor, arg});
    Check dtype_check{Op::kDType, arg};
    dtype_check.value = static_cast<int64_t>(*dtype);
    program.checks_.push_back(dtype_check);
    Check device_check{Op::kDevice, arg};
    device_check.value = static_cast<int64_t>(*device);
    program.checks_.push_back(device_check);
    Check rank{Op::kRank, arg};
    rank.value = t.dims_size();
    program.checks_.push_back(rank);
    for (int d = 0; d < t.dims_size(); ++d) {
      const auto& dim = t.dims(d);
      Check c{Op::kStaticSize, arg, static_cast<uint16_t>(d)};
      if (dim.has_symbol()) {
        auto range = ranges.find(dim.symbol());
        if (range == ranges.end()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: %s.size(%d) uses size symbol %d, which has no range", where,
              parameter_names[arg], d, dim.symbol()));
        }
        if (dim.symbol_offset() < -kMaxSymbolOffset ||
            dim.symbol_offset() > kMaxSymbolOffset) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: %s.size(%d) has a symbol offset %d outside [-%d, %d]",
              where, parameter_names[arg], d, dim.symbol_offset(),
              kMaxSymbolOffset, kMaxSymbolOffset));
        }
        c.offset = dim.symbol_offset();
        auto [slot, inserted] =
            slot_of_symbol.try_emplace(dim.symbol(), program.num_slots_);
        if (inserted) {
          if (program.num_slots_ >= kMaxSymbols) {
            return absl::InvalidArgumentError(absl::StrFormat(
                "%s uses more than %d size symbols", where, kMaxSymbols));
          }
          ++program.num_slots_;
          program.slot_binders_.push_back(
              {arg, static_cast<uint16_t>(d), c.offset});
          c.op = Op::kBindSymbol;
          c.value = range->second->min();
          c.has_max = range->second->has_max();
          c.max = range->second->max();
        } else {
          c.op = Op::kSymbolEqual;
        }
        c.slot = slot->second;
      } else {
        if (dim.static_size() < 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "%s: %s.size(%d) has a negative static size", where,
              parameter_names[arg], d));
        }
        c.value = dim.static_size();
      }
      program.checks_.push_back(c);
    }
  }
  for (const SizeRelation& relation : variant.size_relations()) {
    const SizeRelation::Comparison comparison = relation.comparison();
    absl::StatusOr<SizeProgram> left = ToSlots(relation.left(), slot_of_symbol);
    absl::StatusOr<SizeProgram> right = ToSlots(relation.right(), slot_of_symbol);
    absl::Status bad = !left.ok() ? left.status() : right.status();
    if (bad.ok() && (comparison == SizeRelation::COMPARISON_UNSPECIFIED ||
                     !SizeRelation::Comparison_IsValid(comparison))) {
      bad = absl::InvalidArgumentError("it compares with no known comparison");
    }
    if (!bad.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the size relation '", relation.text(), "' is malformed: ", bad.message()));
    }
    Check c{Op::kSizeRelation};
    c.value = static_cast<int64_t>(program.relations_.size());
    program.relations_.push_back(
        {*std::move(left), *std::move(right), comparison, relation.text()});
    program.checks_.push_back(c);
  }
  return program;
}

namespace {

// The values of a relation's two sides for a call whose symbol slots hold
// `symbols`.
std::pair<SizeValue, SizeValue> Sides(const SizeProgram& left, const SizeProgram& right,
                                      const int64_t* symbols) {
  auto slot = [symbols](int32_t s) -> std::optional<int64_t> { return symbols[s]; };
  return {EvaluateSigned(left, slot), EvaluateSigned(right, slot)};
}

bool Known(const std::pair<SizeValue, SizeValue>& sides) {
  return sides.first.kind == SizeValue::Kind::kKnown &&
         sides.second.kind == SizeValue::Kind::kKnown;
}

}  // namespace

bool GuardProgram::Holds(const Check& c, absl::Span<const ArgView> args,
                         const GlobalState& state, int64_t* symbols) const {
  switch (c.op) {
    case Op::kGradMode: return state.grad_enabled == (c.value != 0);
    case Op::kDefaultDType:
      return static_cast<int64_t>(state.default_dtype) == c.value;
    case Op::kSizeRelation: {
      const Relation& r = relations_[c.value];
      const auto sides = Sides(r.left, r.right, symbols);
      return Known(sides) && Compare(sides.first.value, r.comparison, sides.second.value);
    }
    default: break;
  }
  const ArgView& a = args[c.arg];
  switch (c.op) {
    case Op::kIsNone: return a.kind == ArgView::Kind::kNone;
    case Op::kIsTensor: return a.kind == ArgView::Kind::kTensor;
    case Op::kDType: return static_cast<int64_t>(a.dtype) == c.value;
    case Op::kDevice: return static_cast<int64_t>(a.device) == c.value;
    case Op::kRank: return a.rank == c.value;
    case Op::kStaticSize: return a.sizes[c.dim] == c.value;
    case Op::kBindSymbol: {
      int64_t value;
      if (__builtin_sub_overflow(a.sizes[c.dim], c.offset, &value)) {
        return false;
      }
      if (value < c.value || (c.has_max && value > c.max)) return false;
      symbols[c.slot] = value;
      return true;
    }
    case Op::kSymbolEqual: {
      int64_t value;
      return !__builtin_sub_overflow(a.sizes[c.dim], c.offset, &value) &&
             value == symbols[c.slot];
    }
    case Op::kBoolEquals:
      return a.kind == ArgView::Kind::kBool && a.bool_value == (c.value != 0);
    case Op::kIntEquals:
      return a.kind == ArgView::Kind::kInt && a.int_value == c.value;
    case Op::kFloatEquals:
      // A variant captured with NaN folded NaN into its code: NaN holds.
      return a.kind == ArgView::Kind::kFloat &&
             (a.float_value == c.float_value ||
              (std::isnan(a.float_value) && std::isnan(c.float_value)));
    case Op::kStringEquals:
      return a.kind == ArgView::Kind::kString &&
             a.string_value == strings_[c.value];
    default: return false;
  }
}

bool GuardProgram::Matches(absl::Span<const ArgView> args,
                           const GlobalState& state) const {
  int64_t symbols[kMaxSymbols];
  return FirstFailure(args, state, symbols) < 0;
}

int GuardProgram::InputsNotAsTaken(absl::Span<const ArgView> args) const {
  int differ = 0;
  for (const Check& c : checks_) {
    if ((c.op == Op::kIsTensor && args[c.arg].kind != ArgView::Kind::kTensor) ||
        (c.op == Op::kIsNone && args[c.arg].kind != ArgView::Kind::kNone)) {
      ++differ;
    }
  }
  return differ;
}

int GuardProgram::ChecksHeld(absl::Span<const ArgView> args,
                             const GlobalState& state) const {
  int64_t symbols[kMaxSymbols];
  const int failed = FirstFailure(args, state, symbols);
  return failed < 0 ? num_checks() : failed;
}

std::optional<GuardProgram::Mismatch> GuardProgram::ExplainMismatch(
    absl::Span<const ArgView> args, const GlobalState& state) const {
  int64_t symbols[kMaxSymbols];
  const int failed = FirstFailure(args, state, symbols);
  if (failed < 0) return std::nullopt;
  return Mismatch{failed, Describe(checks_[failed], args, state, symbols)};
}

int GuardProgram::FirstFailure(absl::Span<const ArgView> args, const GlobalState& state,
                               int64_t* symbols) const {
  for (size_t i = 0; i < checks_.size(); ++i) {
    if (!Holds(checks_[i], args, state, symbols)) return static_cast<int>(i);
  }
  return -1;
}

std::string GuardProgram::DimName(uint16_t arg, uint16_t dim) const {
  return absl::StrFormat("%s.size(%d)", parameter_names_[arg], dim);
}

std::string GuardProgram::RelationText(const Relation& r, const int64_t* symbols) const {
  // Guards on windows and patches can run to thousands of characters (Swin's
  // padding), which no client reads: a long one is cut, and the sizes it
  // relates are named with the values the call gave them instead.
  constexpr size_t kMaxGuardText = 160;
  if (r.text.size() <= kMaxGuardText) {
    return absl::StrCat("shape guard: expected ", r.text);
  }
  std::vector<int32_t> slots;
  for (const SizeProgram* side : {&r.left, &r.right}) {
    for (const SizeProgram::Step& step : side->steps()) {
      if (step.step_case() == SizeProgram::Step::kSymbol &&
          absl::c_find(slots, step.symbol()) == slots.end()) {
        slots.push_back(step.symbol());
      }
    }
  }
  std::vector<std::string> sizes;
  for (int32_t slot : slots) {
    const SlotBinder& binder = slot_binders_[slot];
    sizes.push_back(absl::StrCat(DimName(binder.arg, binder.dim), " = ",
                                 SaturatingAdd(symbols[slot], binder.offset)));
  }
  return absl::StrCat("shape guard on ", absl::StrJoin(sizes, ", "), ": expected ",
                      r.text.substr(0, kMaxGuardText), "... (", r.text.size(),
                      " characters in all)");
}

std::string GuardProgram::Describe(const Check& c,
                                   absl::Span<const ArgView> args,
                                   const GlobalState& state,
                                   const int64_t* symbols) const {
  auto on_off = [](bool b) { return b ? "enabled" : "disabled"; };
  switch (c.op) {
    case Op::kGradMode:
      return absl::StrCat("grad mode: expected ", on_off(c.value != 0),
                          ", got ", on_off(state.grad_enabled));
    case Op::kDefaultDType:
      return absl::StrCat("default dtype: expected ",
                          DTypeName(static_cast<DType>(c.value)), ", got ",
                          DTypeName(state.default_dtype));
    case Op::kSizeRelation: {
      const Relation& r = relations_[c.value];
      const auto sides = Sides(r.left, r.right, symbols);
      const std::string guard = RelationText(r, symbols);
      if (!Known(sides)) {
        const bool overflow = sides.first.kind == SizeValue::Kind::kOverflow ||
                              sides.second.kind == SizeValue::Kind::kOverflow;
        return absl::StrCat(guard, ", got sizes whose ",
                            overflow ? "arithmetic leaves 64 bits" : "arithmetic divides by zero");
      }
      return absl::StrCat(guard, ", got ", sides.first.value, " ",
                          FailedComparisonText(r.comparison), " ", sides.second.value);
    }
    default: break;
  }
  const ArgView& a = args[c.arg];
  const std::string& name = parameter_names_[c.arg];
  switch (c.op) {
    case Op::kIsNone:
      return absl::StrCat(name, ": expected None, got ", KindName(a.kind));
    case Op::kIsTensor:
      return absl::StrCat(name, ": expected a tensor, got ", KindName(a.kind));
    case Op::kDType:
      return absl::StrCat(name, ".dtype: expected ",
                          DTypeName(static_cast<DType>(c.value)), ", got ",
                          DTypeName(a.dtype));
    case Op::kDevice:
      return absl::StrCat(name, ".device: expected ",
                          DeviceTypeName(static_cast<DeviceType>(c.value)),
                          ", got ", DeviceTypeName(a.device));
    case Op::kRank:
      return absl::StrCat(name, ".dim(): expected ", c.value, ", got ", a.rank);
    case Op::kStaticSize:
      return absl::StrCat(DimName(c.arg, c.dim), ": expected ", c.value,
                          ", got ", a.sizes[c.dim]);
    case Op::kBindSymbol:
      return absl::StrCat(DimName(c.arg, c.dim), ": expected a size in [",
                          SaturatingAdd(c.value, c.offset), ", ",
                          c.has_max
                              ? absl::StrCat(SaturatingAdd(c.max, c.offset), "]")
                              : "inf)",
                          ", got ", a.sizes[c.dim]);
    case Op::kSymbolEqual: {
      const SlotBinder& binder = slot_binders_[c.slot];
      const int64_t more = c.offset - binder.offset;
      return absl::StrCat(
          DimName(c.arg, c.dim), ": expected ", DimName(binder.arg, binder.dim),
          more == 0 ? "" : absl::StrFormat("%+d", more), " (",
          SaturatingAdd(symbols[c.slot], c.offset), "), got ", a.sizes[c.dim]);
    }
    case Op::kBoolEquals:
      if (a.kind != ArgView::Kind::kBool) {
        return absl::StrCat(name, ": expected a bool, got ", KindName(a.kind));
      }
      return absl::StrCat(name, ": expected ", c.value ? "True" : "False",
                          ", got ", ValueText(a));
    case Op::kIntEquals:
      if (a.kind != ArgView::Kind::kInt) {
        return absl::StrCat(name, ": expected an int, got ", KindName(a.kind));
      }
      return absl::StrCat(name, ": expected ", c.value, ", got ", ValueText(a));
    case Op::kFloatEquals:
      if (a.kind != ArgView::Kind::kFloat) {
        return absl::StrCat(name, ": expected a float, got ", KindName(a.kind));
      }
      return absl::StrCat(name, ": expected ", c.float_value, ", got ",
                          ValueText(a));
    case Op::kStringEquals:
      if (a.kind != ArgView::Kind::kString) {
        return absl::StrCat(name, ": expected a string, got ", KindName(a.kind));
      }
      return absl::StrCat(name, ": expected '", strings_[c.value], "', got ",
                          ValueText(a));
    default: return "unknown guard";
  }
}

}  // namespace precompile
