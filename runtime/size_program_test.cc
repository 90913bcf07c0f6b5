#include "runtime/size_program.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>

namespace precompile {
namespace {

using artifact::v1::SizeProgram;

struct Symbol {
  int32_t id;
};
using Step = std::variant<int64_t, Symbol, SizeProgram::Op>;

SizeProgram Program(std::initializer_list<Step> steps) {
  SizeProgram program;
  for (const Step& s : steps) {
    SizeProgram::Step* step = program.add_steps();
    if (const int64_t* c = std::get_if<int64_t>(&s)) step->set_constant(*c);
    if (const Symbol* y = std::get_if<Symbol>(&s)) step->set_symbol(y->id);
    if (const SizeProgram::Op* op = std::get_if<SizeProgram::Op>(&s)) step->set_op(*op);
  }
  return program;
}

// Symbol 0 is 10, symbol 1 is 3, symbol 2 is INT64_MAX; others unknown.
SizeValue Eval(const SizeProgram& program) {
  return EvaluateSize(program, [](int32_t symbol) -> std::optional<int64_t> {
    if (symbol == 0) return 10;
    if (symbol == 1) return 3;
    if (symbol == 2) return INT64_MAX;
    return std::nullopt;
  });
}

int64_t Known(const SizeProgram& program) {
  const SizeValue v = Eval(program);
  EXPECT_EQ(v.kind, SizeValue::Kind::kKnown);
  return v.value;
}

TEST(EvaluateSize, ComputesWhatTheCaptureRecorded) {
  // 2 * s0 + 1
  EXPECT_EQ(Known(Program({int64_t{2}, Symbol{0}, SizeProgram::MUL, int64_t{1},
                           SizeProgram::ADD})), 21);
  // (s0 - 3) // 2 + 1: a strided convolution
  EXPECT_EQ(Known(Program({Symbol{0}, int64_t{-3}, SizeProgram::ADD, int64_t{2},
                           SizeProgram::FLOOR_DIV, int64_t{1}, SizeProgram::ADD})), 4);
  // -((-s0) // s1): a ceiling division, as Python floors
  EXPECT_EQ(Known(Program({Symbol{0}, int64_t{-1}, SizeProgram::MUL, Symbol{1},
                           SizeProgram::FLOOR_DIV, int64_t{-1}, SizeProgram::MUL})), 4);
  // -7 % 3 is 2 in Python; plus 0
  EXPECT_EQ(Known(Program({int64_t{-7}, Symbol{1}, SizeProgram::MOD})), 2);
  EXPECT_EQ(Known(Program({Symbol{0}, Symbol{1}, SizeProgram::MAX})), 10);
  EXPECT_EQ(Known(Program({Symbol{0}, Symbol{1}, SizeProgram::MIN})), 3);
}

TEST(EvaluateSize, APastTwoToThe63IsAnOverflowNeverAWrappedValue) {
  // INT64_MAX * INT64_MAX wraps to 1 in 64 bits.
  EXPECT_EQ(Eval(Program({Symbol{2}, Symbol{2}, SizeProgram::MUL})).kind,
            SizeValue::Kind::kOverflow);
  EXPECT_EQ(Eval(Program({Symbol{2}, int64_t{1}, SizeProgram::ADD})).kind,
            SizeValue::Kind::kOverflow);
  EXPECT_EQ(Known(Program({Symbol{2}, int64_t{0}, SizeProgram::ADD})), INT64_MAX);
}

TEST(EvaluateSize, WhatCannotBeComputedIsUnknown) {
  const auto unknown = SizeValue::Kind::kUnknown;
  EXPECT_EQ(Eval(Program({Symbol{7}})).kind, unknown);  // No value.
  EXPECT_EQ(Eval(Program({Symbol{0}, int64_t{0}, SizeProgram::FLOOR_DIV})).kind, unknown);
  EXPECT_EQ(Eval(Program({Symbol{0}, int64_t{0}, SizeProgram::MOD})).kind, unknown);
  EXPECT_EQ(Eval(Program({Symbol{0}, SizeProgram::ADD})).kind, unknown);  // One operand.
  EXPECT_EQ(Eval(Program({Symbol{0}, Symbol{1}})).kind, unknown);  // Two results.
  EXPECT_EQ(Eval(Program({})).kind, unknown);
  EXPECT_EQ(Eval(Program({int64_t{-1}})).kind, unknown);  // A negative size.
  EXPECT_EQ(Eval(Program({Symbol{0}, Symbol{1}, SizeProgram::OP_UNSPECIFIED})).kind, unknown);
  SizeProgram empty_step;
  empty_step.add_steps();
  EXPECT_EQ(Eval(empty_step).kind, unknown);
}

TEST(EvaluateSigned, ASideOfARelationMayBeNegativeButNotWrapped) {
  auto symbols = [](int32_t symbol) -> std::optional<int64_t> {
    if (symbol == 0) return 10;
    if (symbol == 2) return INT64_MAX;
    return std::nullopt;
  };
  // 3 - s0, as the capture writes a difference.
  const SizeValue difference = EvaluateSigned(
      Program({int64_t{3}, Symbol{0}, int64_t{-1}, SizeProgram::MUL, SizeProgram::ADD}), symbols);
  EXPECT_EQ(difference.kind, SizeValue::Kind::kKnown);
  EXPECT_EQ(difference.value, -7);
  // The same program is no size.
  EXPECT_EQ(
      Eval(Program({int64_t{3}, Symbol{0}, int64_t{-1}, SizeProgram::MUL, SizeProgram::ADD})).kind,
      SizeValue::Kind::kUnknown);
  EXPECT_EQ(EvaluateSigned(Program({Symbol{2}, int64_t{-1}, SizeProgram::MUL, Symbol{2},
                                    int64_t{-1}, SizeProgram::MUL, SizeProgram::ADD}),
                           symbols)
                .kind,
            SizeValue::Kind::kOverflow);
  EXPECT_EQ(EvaluateSigned(Program({Symbol{0}, int64_t{0}, SizeProgram::MOD}), symbols).kind,
            SizeValue::Kind::kUnknown);
}

}  // namespace
}  // namespace precompile
