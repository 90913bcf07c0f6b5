// A variant's guards compiled into a flat list of checks.
//
// A variant of a frame is valid only for calls whose arguments satisfy the
// guards recorded at capture: the structure of the arguments (a tensor, None
// or a scalar of a given type), each tensor's dtype, device, rank and sizes
// (static, or bound to a size symbol with a range, where dimensions sharing a
// symbol must be equal), relations between the sizes that torch.export keeps
// only as code (a product of sizes against another, a divisibility), the
// specialized values of non-tensor arguments, and the global state the
// compiled code assumed (grad mode, default dtype).
//
// Matches() is the hot path: it allocates nothing and stops at the first
// failing check. ExplainMismatch() re-runs the checks to say, in words, which
// one failed ("x.size(0): expected 8, got 16").
//
// Thread safety: a compiled GuardProgram is immutable; any number of threads
// may evaluate it at once.
#ifndef PRECOMPILE_RUNTIME_GUARD_PROGRAM_H_
#define PRECOMPILE_RUNTIME_GUARD_PROGRAM_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/artifact.pb.h"
#include "runtime/dtype.h"

namespace precompile {

// One bound argument of a call, as the guards see it. Borrowed: `sizes` and
// `string_value` point into the caller's argument storage.
struct ArgView {
  enum class Kind : uint8_t { kNone, kTensor, kBool, kInt, kFloat, kString };
  Kind kind = Kind::kNone;
  DType dtype = DType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  int32_t rank = 0;
  const int64_t* sizes = nullptr;
  bool bool_value = false;
  int64_t int_value = 0;
  double float_value = 0;
  absl::string_view string_value;
};

// Process state that compiled code depends on.
struct GlobalState {
  bool grad_enabled = false;
  DType default_dtype = DType::kFloat32;
};

class GuardProgram {
 public:
  // The largest number of distinct size symbols one variant may use.
  static constexpr int kMaxSymbols = 64;

  // Compiles `variant`'s guards for a frame whose parameters are
  // `parameter_names` (in signature order). INVALID_ARGUMENT if a guard names
  // a parameter that does not exist, uses an unknown dtype, device or symbol,
  // binds too many symbols, or has an empty range, or if a size relation is
  // not a well-formed comparison of symbols that the dimensions bind.
  static absl::StatusOr<GuardProgram> Compile(
      const artifact::v1::Variant& variant,
      const std::vector<std::string>& parameter_names);

  // True if every guard holds for `args` (one per parameter, in order) and
  // `state`. REQUIRES: args.size() == number of parameters.
  bool Matches(absl::Span<const ArgView> args, const GlobalState& state) const;

  struct Mismatch {
    // How many checks held before the failing one: a higher count means a
    // closer variant.
    int checks_passed = 0;
    std::string reason;
  };
  // nullopt if the guards hold; otherwise the first failing check in words.
  std::optional<Mismatch> ExplainMismatch(absl::Span<const ArgView> args,
                                          const GlobalState& state) const;
  // How many checks hold before the first failing one (num_checks() if all
  // hold): ExplainMismatch's checks_passed, without building the words.
  int ChecksHeld(absl::Span<const ArgView> args, const GlobalState& state) const;
  // How many parameters are not a tensor, or not None, as the guards expect,
  // whatever their dtypes, sizes or values: which inputs a call sends is the
  // client's choice of variant (a prefill sends no cache), so a miss is best
  // explained by a variant that takes the inputs it sent, or the most of them.
  int InputsNotAsTaken(absl::Span<const ArgView> args) const;

  int num_checks() const { return static_cast<int>(checks_.size()); }

 private:
  enum class Op : uint8_t {
    kGradMode,
    kDefaultDType,
    kIsNone,
    kIsTensor,
    kDType,
    kDevice,
    kRank,
    kStaticSize,
    kBindSymbol,   // First use of a symbol: range check, then remember it.
    kSymbolEqual,  // Later use: equal to the remembered size.
    kBoolEquals,
    kIntEquals,
    kFloatEquals,
    kStringEquals,
    kSizeRelation,  // After every dimension: all symbols are bound.
  };
  struct Check {
    Op op;
    uint16_t arg = 0;
    uint16_t dim = 0;
    uint16_t slot = 0;  // Symbol slot for kBindSymbol / kSymbolEqual.
    // kBindSymbol / kSymbolEqual: the size is the symbol's value plus this.
    int64_t offset = 0;
    // Expected size, int, bool, dtype, device, string index or relation index.
    int64_t value = 0;
    int64_t max = 0;    // kBindSymbol: inclusive upper bound (if has_max).
    bool has_max = false;
    double float_value = 0;
  };

  // Index of the first check that fails, or -1 when all hold. `symbols`:
  // kMaxSymbols slots, left holding the sizes bound up to that check.
  int FirstFailure(absl::Span<const ArgView> args, const GlobalState& state,
                   int64_t* symbols) const;
  // Evaluates check `c`, reading and writing symbol slot values.
  bool Holds(const Check& c, absl::Span<const ArgView> args,
             const GlobalState& state, int64_t* symbols) const;
  std::string Describe(const Check& c, absl::Span<const ArgView> args,
                       const GlobalState& state, const int64_t* symbols) const;
  std::string DimName(uint16_t arg, uint16_t dim) const;

  std::vector<Check> checks_;
  std::vector<std::string> parameter_names_;
  std::vector<std::string> strings_;
  // A SizeRelation whose programs' symbol steps name symbol slots.
  struct Relation {
    artifact::v1::SizeProgram left;
    artifact::v1::SizeProgram right;
    artifact::v1::SizeRelation::Comparison comparison;
    std::string text;
  };
  // "shape guard: expected <r's text>", a long text cut short.
  std::string RelationText(const Relation& r, const int64_t* symbols) const;
  std::vector<Relation> relations_;
  // For each slot: the argument and dimension that first bind it, and that
  // dimension's offset from the symbol.
  struct SlotBinder {
    uint16_t arg;
    uint16_t dim;
    int64_t offset;
  };
  std::vector<SlotBinder> slot_binders_;
  int num_slots_ = 0;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_GUARD_PROGRAM_H_
