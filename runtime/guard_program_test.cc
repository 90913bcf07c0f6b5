#include "runtime/guard_program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/text_format.h"
#include "runtime/frame_dispatcher.h"

namespace precompile {
namespace {

using ::testing::HasSubstr;

artifact::v1::Variant ParseVariant(const std::string& text) {
  artifact::v1::Variant v;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &v)) << text;
  return v;
}

// forward(x, y, n): x and y share their batch size s0 in [2, inf), x has 4
// features, n was specialized to 0.
const char kDynamicBatch[] = R"pb(
  id: "forward#1"
  global_state { grad_enabled: false default_dtype: DTYPE_FLOAT32 }
  symbols { symbol: 7 min: 2 name: "s0" }
  guards {
    parameter: 0
    tensor {
      dtype: DTYPE_FLOAT32
      device: "cpu"
      dims { symbol: 7 }
      dims { static_size: 4 }
    }
  }
  guards {
    parameter: 1
    tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 7 } }
  }
  guards { parameter: 2 equals { int_value: 0 } }
)pb";

const std::vector<std::string> kNames = {"x", "y", "n"};

struct Call {
  std::vector<int64_t> x_shape = {8, 4};
  std::vector<int64_t> y_shape = {8};
  DType x_dtype = DType::kFloat32;
  ArgView::Kind n_kind = ArgView::Kind::kInt;
  int64_t n = 0;

  std::vector<ArgView> Views() const {
    std::vector<ArgView> views(3);
    views[0].kind = ArgView::Kind::kTensor;
    views[0].dtype = x_dtype;
    views[0].rank = static_cast<int32_t>(x_shape.size());
    views[0].sizes = x_shape.data();
    views[1].kind = ArgView::Kind::kTensor;
    views[1].rank = static_cast<int32_t>(y_shape.size());
    views[1].sizes = y_shape.data();
    views[2].kind = n_kind;
    views[2].int_value = n;
    return views;
  }
};

GuardProgram Compile(const char* text) {
  absl::StatusOr<GuardProgram> p = GuardProgram::Compile(ParseVariant(text), kNames);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

std::string Explain(const GuardProgram& p, const Call& call,
                    GlobalState state = {}) {
  std::vector<ArgView> views = call.Views();
  auto m = p.ExplainMismatch(views, state);
  return m ? m->reason : "matches";
}

TEST(GuardProgram, MatchesCallsInsideItsGuards) {
  GuardProgram p = Compile(kDynamicBatch);
  for (int64_t batch : {2, 8, 1000}) {
    Call call;
    call.x_shape = {batch, 4};
    call.y_shape = {batch};
    std::vector<ArgView> views = call.Views();
    EXPECT_TRUE(p.Matches(views, GlobalState{})) << batch;
    EXPECT_EQ(Explain(p, call), "matches");
  }
}

TEST(GuardProgram, ExplainsEachKindOfMismatchInWords) {
  GuardProgram p = Compile(kDynamicBatch);
  Call static_size;
  static_size.x_shape = {8, 5};
  EXPECT_EQ(Explain(p, static_size), "x.size(1): expected 4, got 5");

  Call below_range;
  below_range.x_shape = {1, 4};
  below_range.y_shape = {1};
  EXPECT_EQ(Explain(p, below_range), "x.size(0): expected a size in [2, inf), got 1");

  Call unequal;
  unequal.y_shape = {16};
  EXPECT_EQ(Explain(p, unequal), "y.size(0): expected x.size(0) (8), got 16");

  Call scalar;
  scalar.n = 2;
  EXPECT_EQ(Explain(p, scalar), "n: expected 0, got 2");

  Call kind;
  kind.n_kind = ArgView::Kind::kFloat;
  EXPECT_EQ(Explain(p, kind), "n: expected an int, got a float");

  Call dtype;
  dtype.x_dtype = DType::kFloat16;
  EXPECT_EQ(Explain(p, dtype), "x.dtype: expected float32, got float16");

  Call rank;
  rank.x_shape = {8, 4, 1};
  EXPECT_EQ(Explain(p, rank), "x.dim(): expected 2, got 3");

  EXPECT_EQ(Explain(p, Call{}, GlobalState{/*grad_enabled=*/true}),
            "grad mode: expected disabled, got enabled");
}

// Every kind of check, each refusing a call that differs from the guards in
// that one respect: deleting or inverting any check makes a case fail.
// forward(x, ids, mask, flag, n, alpha, mode, opt, eps).
const char kEveryKind[] = R"pb(
  id: "forward#0"
  global_state { grad_enabled: true default_dtype: DTYPE_FLOAT64 }
  symbols { symbol: 1 min: 2 max: 16 name: "s0" }
  guards {
    parameter: 0
    tensor { dtype: DTYPE_FLOAT32 device: "cuda" dims { symbol: 1 } dims { static_size: 3 } }
  }
  guards { parameter: 1 tensor { dtype: DTYPE_INT64 device: "cpu" dims { symbol: 1 } } }
  guards { parameter: 2 tensor { is_none: true } }
  guards { parameter: 3 equals { bool_value: true } }
  guards { parameter: 4 equals { int_value: -7 } }
  guards { parameter: 5 equals { float_value: 0.5 } }
  guards { parameter: 6 equals { string_value: "mean" } }
  guards { parameter: 7 equals { none: true } }
  guards { parameter: 8 equals { float_value: nan } }
)pb";

struct EveryKindCall {
  std::vector<int64_t> x_shape = {4, 3};
  std::vector<int64_t> ids_shape = {4};
  std::vector<ArgView> views = std::vector<ArgView>(9);
  GlobalState state{/*grad_enabled=*/true, DType::kFloat64};

  EveryKindCall() {
    views[0].kind = ArgView::Kind::kTensor;
    views[0].device = DeviceType::kCuda;
    views[1].kind = ArgView::Kind::kTensor;
    views[1].dtype = DType::kInt64;
    views[3].kind = ArgView::Kind::kBool;
    views[3].bool_value = true;
    views[4].kind = ArgView::Kind::kInt;
    views[4].int_value = -7;
    views[5].kind = ArgView::Kind::kFloat;
    views[5].float_value = 0.5;
    views[6].kind = ArgView::Kind::kString;
    views[6].string_value = "mean";
    views[8].kind = ArgView::Kind::kFloat;
    views[8].float_value = std::nan("");
  }
  // The views, with the tensors' sizes pointing at this call's shapes.
  absl::Span<const ArgView> Args() {
    views[0].rank = static_cast<int32_t>(x_shape.size());
    views[0].sizes = x_shape.data();
    views[1].rank = static_cast<int32_t>(ids_shape.size());
    views[1].sizes = ids_shape.data();
    return views;
  }
};

TEST(GuardProgram, EveryKindOfCheckRefusesItsOwnMismatch) {
  const std::vector<std::string> names = {"x",     "ids",  "mask", "flag", "n",
                                          "alpha", "mode", "opt",  "eps"};
  absl::StatusOr<GuardProgram> compiled = GuardProgram::Compile(ParseVariant(kEveryKind), names);
  ASSERT_TRUE(compiled.ok()) << compiled.status();
  const GuardProgram& p = *compiled;
  auto explain = [&](EveryKindCall call) {
    auto m = p.ExplainMismatch(call.Args(), call.state);
    EXPECT_EQ(p.Matches(call.Args(), call.state), !m.has_value());
    return m ? m->reason : "matches";
  };
  EXPECT_EQ(explain(EveryKindCall{}), "matches");
  // Both ends of the symbol's range hold.
  for (int64_t size : {2, 16}) {
    EveryKindCall edge;
    edge.x_shape[0] = edge.ids_shape[0] = size;
    EXPECT_EQ(explain(edge), "matches") << size;
  }

  struct Case {
    std::string reason;
    std::function<void(EveryKindCall&)> change;
  };
  const std::vector<Case> cases = {
      {"grad mode: expected enabled, got disabled", [](auto& c) { c.state.grad_enabled = false; }},
      {"default dtype: expected float64, got float32",
       [](auto& c) { c.state.default_dtype = DType::kFloat32; }},
      {"x: expected a tensor, got None", [](auto& c) { c.views[0].kind = ArgView::Kind::kNone; }},
      {"x.dtype: expected float32, got bfloat16",
       [](auto& c) { c.views[0].dtype = DType::kBFloat16; }},
      {"x.device: expected cuda, got cpu", [](auto& c) { c.views[0].device = DeviceType::kCpu; }},
      {"x.dim(): expected 2, got 3", [](auto& c) { c.x_shape = {4, 3, 1}; }},
      {"x.size(0): expected a size in [2, 16], got 1",
       [](auto& c) { c.x_shape[0] = c.ids_shape[0] = 1; }},
      {"x.size(0): expected a size in [2, 16], got 17",
       [](auto& c) { c.x_shape[0] = c.ids_shape[0] = 17; }},
      {"x.size(1): expected 3, got 4", [](auto& c) { c.x_shape[1] = 4; }},
      {"ids.dtype: expected int64, got int32", [](auto& c) { c.views[1].dtype = DType::kInt32; }},
      {"ids.size(0): expected x.size(0) (4), got 5", [](auto& c) { c.ids_shape[0] = 5; }},
      {"mask: expected None, got a tensor",
       [](auto& c) { c.views[2].kind = ArgView::Kind::kTensor; }},
      {"flag: expected True, got False", [](auto& c) { c.views[3].bool_value = false; }},
      {"flag: expected a bool, got an int", [](auto& c) {
         c.views[3].kind = ArgView::Kind::kInt;
         c.views[3].int_value = 1;
       }},
      {"n: expected -7, got 7", [](auto& c) { c.views[4].int_value = 7; }},
      {"n: expected an int, got a bool", [](auto& c) { c.views[4].kind = ArgView::Kind::kBool; }},
      {"alpha: expected 0.5, got 0.25", [](auto& c) { c.views[5].float_value = 0.25; }},
      {"alpha: expected 0.5, got nan", [](auto& c) { c.views[5].float_value = std::nan(""); }},
      {"alpha: expected a float, got an int", [](auto& c) {
         c.views[5].kind = ArgView::Kind::kInt;
         c.views[5].int_value = 0;
       }},
      {"mode: expected 'mean', got 'sum'", [](auto& c) { c.views[6].string_value = "sum"; }},
      {"mode: expected a string, got None", [](auto& c) { c.views[6].kind = ArgView::Kind::kNone; }},
      {"opt: expected None, got an int", [](auto& c) { c.views[7].kind = ArgView::Kind::kInt; }},
      {"eps: expected nan, got 1", [](auto& c) { c.views[8].float_value = 1.0; }},
  };
  for (const Case& c : cases) {
    EveryKindCall call;
    c.change(call);
    EXPECT_EQ(explain(call), c.reason);
  }
}

TEST(GuardProgram, FailsFastOnTheFirstFailingCheck) {
  GuardProgram p = Compile(kDynamicBatch);
  Call call;
  call.x_dtype = DType::kFloat64;  // fails before the sizes are read
  call.x_shape = {1, 1};
  std::vector<ArgView> views = call.Views();
  auto m = p.ExplainMismatch(views, GlobalState{});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->reason, "x.dtype: expected float32, got float64");
  // grad mode, default dtype, then x's kind: three checks held first.
  EXPECT_EQ(m->checks_passed, 3);
  EXPECT_EQ(p.ChecksHeld(views, GlobalState{}), 3);
  // A call inside the guards holds every check.
  Call inside;
  EXPECT_EQ(p.ChecksHeld(inside.Views(), GlobalState{}), p.num_checks());
}

// forward(x, y, n): y is one longer than x (a mask and the cache it goes
// with), x's length in [1, 127].
const char kOneLonger[] = R"pb(
  id: "forward#3"
  global_state { grad_enabled: false default_dtype: DTYPE_FLOAT32 }
  symbols { symbol: 0 min: 1 max: 127 name: "s0" }
  guards { parameter: 0 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 0 } dims { static_size: 4 } } }
  guards { parameter: 1 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 0 symbol_offset: 1 } } }
)pb";

TEST(GuardProgram, ADimensionMayBeItsSymbolPlusAnOffset) {
  GuardProgram p = Compile(kOneLonger);
  Call call;
  for (int64_t length : {1, 9, 127}) {
    call.x_shape = {length, 4};
    call.y_shape = {length + 1};
    EXPECT_EQ(Explain(p, call), "matches") << length;
  }
  call.x_shape = {9, 4};
  call.y_shape = {9};
  EXPECT_EQ(Explain(p, call), "y.size(0): expected x.size(0)+1 (10), got 9");
  call.y_shape = {11};
  EXPECT_EQ(Explain(p, call), "y.size(0): expected x.size(0)+1 (10), got 11");
  // The range is the symbol's: x up to 127, so y up to 128.
  call.x_shape = {128, 4};
  call.y_shape = {129};
  EXPECT_EQ(Explain(p, call), "x.size(0): expected a size in [1, 127], got 128");

  // Bound first where the offset is: the range shifts with it.
  GuardProgram q = Compile(R"pb(
    id: "forward#4"
    global_state { grad_enabled: false default_dtype: DTYPE_FLOAT32 }
    symbols { symbol: 0 min: 1 max: 127 name: "s0" }
    guards { parameter: 1 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 0 symbol_offset: 1 } } }
    guards { parameter: 0 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 0 } dims { static_size: 4 } } }
  )pb");
  call.x_shape = {9, 4};
  call.y_shape = {10};
  EXPECT_EQ(Explain(q, call), "matches");
  call.y_shape = {1};
  EXPECT_EQ(Explain(q, call), "y.size(0): expected a size in [2, 128], got 1");
  call.y_shape = {11};
  EXPECT_EQ(Explain(q, call), "x.size(0): expected y.size(0)-1 (10), got 9");
  // Sizes near 2^63 with a negative offset do not wrap into the range.
  std::string negative = kOneLonger;
  negative.replace(negative.find("symbol_offset: 1"), 16, "symbol_offset: -1");
  GuardProgram r = Compile(negative.c_str());
  call.x_shape = {5, 4};
  call.y_shape = {std::numeric_limits<int64_t>::max()};
  EXPECT_THAT(Explain(r, call), HasSubstr("y.size(0): expected x.size(0)-1 (4)"));
}

// forward(x, y, n): x is [s0, s1] and y [s2], with s0 * s1 == s2 (a view of
// x's rows as y's) and s1 divisible by 4: relations torch.export keeps only
// as code. In postfix over the symbols, as the capture writes them.
const char kRelated[] = R"pb(
  id: "forward#5"
  global_state { grad_enabled: false default_dtype: DTYPE_FLOAT32 }
  symbols { symbol: 0 min: 2 name: "s0" }
  symbols { symbol: 1 min: 2 name: "s1" }
  symbols { symbol: 2 min: 2 name: "s2" }
  guards {
    parameter: 0
    tensor {
      dtype: DTYPE_FLOAT32
      device: "cpu"
      dims { symbol: 0 }
      dims { symbol: 1 }
    }
  }
  guards {
    parameter: 1
    tensor {
      dtype: DTYPE_FLOAT32
      device: "cpu"
      dims { symbol: 2 }
    }
  }
  size_relations {
    left {
      steps { symbol: 0 }
      steps { symbol: 1 }
      steps { op: MUL }
    }
    comparison: EQ
    right { steps { symbol: 2 } }
    text: "x.size(0)*x.size(1) == y.size(0)"
  }
  size_relations {
    left {
      steps { symbol: 1 }
      steps { constant: 4 }
      steps { op: MOD }
    }
    comparison: EQ
    right { steps { constant: 0 } }
    text: "x.size(1) % 4 == 0"
  }
)pb";

TEST(GuardProgram, SizesMustKeepTheRelationsTheCaptureRecorded) {
  GuardProgram p = Compile(kRelated);
  Call call;
  call.x_shape = {3, 8};
  call.y_shape = {24};
  EXPECT_EQ(Explain(p, call), "matches");
  call.y_shape = {23};
  EXPECT_EQ(Explain(p, call),
            "shape guard: expected x.size(0)*x.size(1) == y.size(0), got 24 != 23");
  call.x_shape = {4, 6};
  call.y_shape = {24};
  EXPECT_EQ(Explain(p, call), "shape guard: expected x.size(1) % 4 == 0, got 2 != 0");
  // An earlier guard fails first: the relations come after every dimension.
  call.x_dtype = DType::kFloat64;
  EXPECT_EQ(Explain(p, call), "x.dtype: expected float32, got float64");
  // A product past 64 bits is no match, never a wrapped one: 2^62 * 8
  // wraps to 0 in 64 bits, which a y of 0 rows would equal.
  call.x_dtype = DType::kFloat32;
  call.x_shape = {int64_t{1} << 62, 8};
  call.y_shape = {0};
  EXPECT_EQ(Explain(p, call), "y.size(0): expected a size in [2, inf), got 0");
  call.y_shape = {2};
  EXPECT_EQ(Explain(p, call),
            "shape guard: expected x.size(0)*x.size(1) == y.size(0), got sizes whose arithmetic "
            "leaves 64 bits");
}

// Window and patch arithmetic gives guards of thousands of characters; a
// refusal quotes the start of one and names the sizes it relates instead.
TEST(GuardProgram, ALongShapeGuardIsCutAndItsSizesNamed) {
  std::string long_text = "x.size(0)*x.size(1)";
  for (int i = 0; i < 60; ++i) absl::StrAppend(&long_text, " + 0");
  absl::StrAppend(&long_text, " == y.size(0)");
  GuardProgram p = Compile(
      absl::StrReplaceAll(kRelated, {{"x.size(0)*x.size(1) == y.size(0)", long_text}}).c_str());
  Call call;
  call.x_shape = {3, 8};
  call.y_shape = {23};
  const std::string reason = Explain(p, call);
  EXPECT_EQ(reason, absl::StrCat("shape guard on x.size(0) = 3, x.size(1) = 8, y.size(0) = 23: "
                                 "expected ",
                                 long_text.substr(0, 160), "... (", long_text.size(),
                                 " characters in all), got 24 != 23"));
  EXPECT_LT(reason.size(), 300u);
}

// forward(x, y, n) with y's size the symbol s0 (and a symbol s3 that no
// dimension binds), and one size relation: `fields`.
const char kYSizedByS0[] = R"pb(
  id: "v"
  symbols { symbol: 0 min: 0 name: "s0" }
  symbols { symbol: 3 min: 0 name: "s3" }
  guards {
    parameter: 1
    tensor {
      dtype: DTYPE_FLOAT32
      device: "cpu"
      dims { symbol: 0 }
    }
  }
)pb";

std::string WithRelation(const std::string& fields) {
  return absl::StrCat(kYSizedByS0, "size_relations { ", fields, " }");
}

TEST(GuardProgram, EachComparisonOfARelationHoldsOnlyOnItsSide) {
  // Each comparison, the sizes it holds for, and the comparison a failure is
  // said with.
  const std::tuple<const char*, std::vector<int64_t>, const char*> holding[] = {
      {"EQ", {5}, "!="},   {"NE", {4, 6}, "=="}, {"LT", {4}, ">="},
      {"LE", {4, 5}, ">"}, {"GT", {6}, "<="},    {"GE", {5, 6}, "<"}};
  for (const auto& [comparison, sizes, failed] : holding) {
    GuardProgram p =
        Compile(WithRelation(absl::StrCat("left { steps { symbol: 0 } } comparison: ", comparison,
                                          R"( right { steps { constant: 5 } } )",
                                          R"(text: "y.size(0) ? 5")"))
                    .c_str());
    for (int64_t size : {4, 5, 6}) {
      Call call;
      call.y_shape = {size};
      const bool expected = std::find(sizes.begin(), sizes.end(), size) != sizes.end();
      EXPECT_EQ(p.Matches(call.Views(), GlobalState{}), expected) << comparison << " " << size;
      EXPECT_EQ(Explain(p, call), expected
                                      ? "matches"
                                      : absl::StrCat("shape guard: expected y.size(0) ? 5, got ",
                                                     size, " ", failed, " 5"));
    }
  }
}

TEST(GuardProgram, RejectsMalformedSizeRelations) {
  auto relation = [](const std::string& fields) {
    return GuardProgram::Compile(ParseVariant(WithRelation(R"(text: "bad" )" + fields)), kNames)
        .status();
  };
  EXPECT_TRUE(
      relation("left { steps { symbol: 0 } } comparison: LE right { steps { constant: 1 } }").ok());
  EXPECT_THAT(
      relation("left { steps { symbol: 3 } } comparison: LE right { steps { constant: 1 } }")
          .message(),
      HasSubstr("size symbol 3, which no dimension binds"));
  EXPECT_THAT(relation("left { steps { symbol: 0 } steps { op: MUL } } comparison: LE "
                       "right { steps { constant: 1 } }")
                  .message(),
              HasSubstr("an operation without its two operands"));
  EXPECT_THAT(relation("left { steps { symbol: 0 } steps { symbol: 0 } } comparison: LE "
                       "right { steps { constant: 1 } }")
                  .message(),
              HasSubstr("does not compute one value"));
  EXPECT_THAT(relation("left { } comparison: LE right { steps { constant: 1 } }").message(),
              HasSubstr("does not compute one value"));
  // 17 values before the first operation: more than Matches() holds without
  // allocating. 16 load.
  auto nested = [](int values) {
    std::string steps;
    for (int i = 0; i < values; ++i) absl::StrAppend(&steps, "steps { symbol: 0 } ");
    for (int i = 1; i < values; ++i) absl::StrAppend(&steps, "steps { op: ADD } ");
    return absl::StrCat("left { ", steps, "} comparison: GE right { steps { constant: 0 } }");
  };
  EXPECT_TRUE(relation(nested(16)).ok());
  EXPECT_THAT(relation(nested(17)).message(), HasSubstr("more than 16 values at once"));
  const absl::Status no_comparison =
      relation("left { steps { symbol: 0 } } right { steps { constant: 1 } }");
  EXPECT_EQ(no_comparison.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_comparison.message(),
              HasSubstr("the size relation 'bad' is malformed: it compares with no known"));
}

TEST(GuardProgram, RejectsMalformedGuards) {
  auto bad_parameter = GuardProgram::Compile(
      ParseVariant(R"pb(id: "v" guards { parameter: 9 equals { int_value: 1 } })pb"),
      kNames);
  EXPECT_EQ(bad_parameter.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_parameter.status().message(), HasSubstr("parameter 9"));

  auto no_range = GuardProgram::Compile(ParseVariant(R"pb(
    id: "v"
    guards { parameter: 0 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { symbol: 3 } } }
  )pb"), kNames);
  EXPECT_THAT(no_range.status().message(), HasSubstr("has no range"));

  auto empty_range = GuardProgram::Compile(ParseVariant(R"pb(
    id: "v" symbols { symbol: 1 min: 5 max: 4 }
  )pb"), kNames);
  EXPECT_THAT(empty_range.status().message(), HasSubstr("empty range"));

  auto bad_device = GuardProgram::Compile(ParseVariant(R"pb(
    id: "v" guards { parameter: 0 tensor { dtype: DTYPE_FLOAT32 device: "tpu" } }
  )pb"), kNames);
  EXPECT_THAT(bad_device.status().message(), HasSubstr("unknown dtype or device 'tpu'"));

  auto huge_offset = GuardProgram::Compile(ParseVariant(R"pb(
    id: "v" symbols { symbol: 1 min: 1 }
    guards { parameter: 0 tensor { dtype: DTYPE_FLOAT32 device: "cpu"
                                   dims { symbol: 1 symbol_offset: -9223372036854775807 } } }
  )pb"), kNames);
  EXPECT_THAT(huge_offset.status().message(), HasSubstr("x.size(0) has a symbol offset"));
}

TEST(FrameDispatcher, PrefersTheMostRecentHitAndExplainsTheClosestVariant) {
  // Variant 0: static batch 8 (n == 0); variant 1: dynamic batch (n == 0).
  std::vector<GuardProgram> programs;
  programs.push_back(Compile(R"pb(
    id: "forward#0"
    guards {
      parameter: 0
      tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { static_size: 8 } dims { static_size: 4 } }
    }
    guards { parameter: 1 tensor { dtype: DTYPE_FLOAT32 device: "cpu" dims { static_size: 8 } } }
    guards { parameter: 2 equals { int_value: 0 } }
  )pb"));
  programs.push_back(Compile(kDynamicBatch));
  FrameDispatcher dispatcher(std::move(programs));

  Call batch8;
  std::vector<ArgView> v8 = batch8.Views();
  EXPECT_EQ(dispatcher.Match(v8, GlobalState{}), 0);

  Call batch16;
  batch16.x_shape = {16, 4};
  batch16.y_shape = {16};
  std::vector<ArgView> v16 = batch16.Views();
  EXPECT_EQ(dispatcher.Match(v16, GlobalState{}), 1);
  // Both variants hold for batch 8 now; the most recent hit answers first.
  EXPECT_EQ(dispatcher.Match(v8, GlobalState{}), 1);

  Call miss;
  miss.x_shape = {16, 4};
  miss.y_shape = {16};
  miss.n = 3;
  std::vector<ArgView> vm = miss.Views();
  EXPECT_EQ(dispatcher.Match(vm, GlobalState{}), -1);
  auto why = dispatcher.ExplainMiss(vm, GlobalState{});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->variant, 1);  // it got as far as n; variant 0 failed at x.size(0)
  EXPECT_EQ(why->reason, "n: expected 0, got 3");
}

// Dynamo compiles a frame's first call static and, once a later call
// misses, recompiles with those sizes dynamic: on a tie the later variant is
// the more general, and its range is what a client needs to hear (not that
// the frame takes only the first call's size).
TEST(FrameDispatcher, OnATieExplainsTheLaterMoreGeneralVariant) {
  std::vector<GuardProgram> programs;
  programs.push_back(Compile(R"pb(
    id: "forward#0"
    guards {
      parameter: 0
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { static_size: 2 }
        dims { static_size: 8 }
      }
    }
  )pb"));
  programs.push_back(Compile(R"pb(
    id: "forward#1"
    symbols { symbol: 1 min: 2 name: "s0" }
    symbols { symbol: 2 min: 2 max: 128 name: "s1" }
    guards {
      parameter: 0
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { symbol: 1 }
        dims { symbol: 2 }
      }
    }
  )pb"));
  FrameDispatcher dispatcher(std::move(programs));
  Call call;
  call.x_shape = {2, 129};
  std::vector<ArgView> views = call.Views();
  ASSERT_EQ(dispatcher.Match(views, GlobalState{}), -1);
  auto why = dispatcher.ExplainMiss(views, GlobalState{});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->variant, 1);
  EXPECT_THAT(why->reason, HasSubstr("[2, 128], got 129"));
}

// A decoder's prefill (no cache) captured at batch 1 and its decode step
// (with a cache) at any batch: a prefill at batch 2 gets further through the
// decode variant's checks than the prefill's, but what it lacks is batch 1,
// not a cache it never meant to send.
TEST(FrameDispatcher, ExplainsAVariantThatTakesTheInputsTheCallSent) {
  std::vector<GuardProgram> programs;
  programs.push_back(Compile(R"pb(
    id: "forward#0"
    guards {
      parameter: 0
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { static_size: 1 }
        dims { static_size: 4 }
      }
    }
    guards {
      parameter: 1
      tensor { is_none: true }
    }
    guards {
      parameter: 2
      equals { int_value: 0 }
    }
  )pb"));
  programs.push_back(Compile(kDynamicBatch));
  FrameDispatcher dispatcher(std::move(programs));

  Call prefill;
  prefill.x_shape = {2, 4};
  std::vector<ArgView> views = prefill.Views();
  views[1] = ArgView{};  // y: None
  ASSERT_EQ(dispatcher.Match(views, GlobalState{}), -1);
  auto why = dispatcher.ExplainMiss(views, GlobalState{});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->variant, 0);
  EXPECT_EQ(why->reason, "x.size(0): expected 1, got 2");

  // A call that sends y is a decode step: the decode variant explains it.
  Call decode;
  decode.x_shape = {2, 4};
  decode.y_shape = {3};
  views = decode.Views();
  why = dispatcher.ExplainMiss(views, GlobalState{});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->variant, 1);
  EXPECT_THAT(why->reason, HasSubstr("y.size(0)"));
}

// GPT-BigCode's prefill sent without its position ids: no variant takes
// those inputs, and the prefill, which lacks one of them, explains the miss
// rather than the decode step, which lacks more, though its checks held
// longer.
TEST(FrameDispatcher, ExplainsAVariantThatTakesTheMostOfTheInputsTheCallSent) {
  std::vector<GuardProgram> programs;
  programs.push_back(Compile(R"pb(
    id: "forward#0"
    symbols { symbol: 1 min: 2 name: "s0" }
    symbols { symbol: 2 min: 2 name: "s1" }
    guards {
      parameter: 0
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { symbol: 1 }
        dims { symbol: 2 }
      }
    }
    guards {
      parameter: 1
      tensor { is_none: true }
    }
    guards {
      parameter: 2
      equals { none: true }
    }
  )pb"));
  programs.push_back(Compile(R"pb(
    id: "forward#1"
    symbols { symbol: 1 min: 1 name: "s0" }
    guards {
      parameter: 0
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { symbol: 1 }
        dims { static_size: 1 }
      }
    }
    guards {
      parameter: 1
      tensor {
        dtype: DTYPE_FLOAT32
        device: "cpu"
        dims { symbol: 1 }
      }
    }
    guards {
      parameter: 2
      equals { none: true }
    }
  )pb"));
  FrameDispatcher dispatcher(std::move(programs));
  Call call;
  call.x_shape = {2, 1};
  std::vector<ArgView> views = call.Views();
  views[1] = ArgView{};  // y: None; n: 0, where both variants take None.
  ASSERT_EQ(dispatcher.Match(views, GlobalState{}), -1);
  auto why = dispatcher.ExplainMiss(views, GlobalState{});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->variant, 0);
  EXPECT_EQ(why->reason, "x.size(1): expected a size in [2, inf), got 1");
}

TEST(FrameDispatcher, AFrameWithoutVariantsMatchesNothing) {
  FrameDispatcher dispatcher({});
  Call call;
  std::vector<ArgView> views = call.Views();
  EXPECT_EQ(dispatcher.Match(views, GlobalState{}), -1);
  EXPECT_FALSE(dispatcher.ExplainMiss(views, GlobalState{}).has_value());
}

}  // namespace
}  // namespace precompile
