#include "server/scheduling/dynamic_batching.h"

#include <google/protobuf/text_format.h>

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<std::shared_ptr<const BatchingConfig>> Read(const std::string& text) {
  inference::ModelConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return ReadBatchingConfig(config);
}

TEST(ReadBatchingConfig, ReadsTritonsSettings) {
  auto none = Read("");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  auto alone = Read("max_batch_size: 8");
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_NE(*alone, nullptr);
  EXPECT_EQ((*alone)->max_batch_size, 8);
  EXPECT_FALSE((*alone)->dynamic);

  auto dynamic = Read(
      "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 500 "
      "preferred_batch_size: [2, 4] }");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  EXPECT_TRUE((*dynamic)->dynamic);
  EXPECT_EQ((*dynamic)->max_queue_delay, absl::Microseconds(500));
  EXPECT_THAT((*dynamic)->preferred_batch_sizes, ElementsAre(2, 4));
  EXPECT_EQ((*dynamic)->full_rows, 4) << "the largest preferred size";

  auto no_preference = Read("max_batch_size: 16 dynamic_batching { }");
  ASSERT_TRUE(no_preference.ok()) << no_preference.status();
  EXPECT_EQ((*no_preference)->full_rows, 16);
  EXPECT_EQ((*no_preference)->max_queue_delay, absl::ZeroDuration());
}

TEST(ReadBatchingConfig, RefusesSettingsThatContradictOrAreNotHonoured) {
  EXPECT_THAT(Read("dynamic_batching { }").status().message(),
              HasSubstr("dynamic_batching needs max_batch_size above 0"));
  EXPECT_THAT(Read("max_batch_size: -1").status().message(),
              HasSubstr("max_batch_size is -1"));
  EXPECT_THAT(
      Read("max_batch_size: 8 dynamic_batching { preferred_batch_size: [9] }").status().message(),
      HasSubstr("preferred_batch_size } lists 9"));
  EXPECT_THAT(
      Read("max_batch_size: 8 dynamic_batching { preferred_batch_size: [0] }").status().message(),
      HasSubstr("lists 0"));
  EXPECT_THAT(Read("max_batch_size: 8 dynamic_batching { priority_levels: 2 }").status().message(),
              HasSubstr("priority levels and queue policies are not supported"));
  EXPECT_THAT(Read("max_batch_size: 8 dynamic_batching { default_queue_policy { "
                   "max_queue_size: 4 } }")
                  .status()
                  .message(),
              HasSubstr("not supported"));
  EXPECT_THAT(Read("max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: "
                   "18446744073709551615 }")
                  .status()
                  .message(),
              HasSubstr("past the limit"));
  for (const char* bad : {"dynamic_batching { }", "max_batch_size: -1"}) {
    EXPECT_THAT(Read(bad).status().message(), HasSubstr("config.pbtxt: ")) << bad;
  }
}

artifact::v1::Frame FrameFrom(const std::string& text) {
  artifact::v1::Frame frame;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &frame)) << text;
  return frame;
}

constexpr char kTwoInputs[] = R"pb(
  name: "forward"
  parameters { name: "input_ids" kind: TENSOR }
  parameters { name: "attention_mask" kind: TENSOR }
  outputs {
    leaves { name: "logits" is_tensor: true }
  }
)pb";

TEST(CheckBatchable, AcceptsInputsSharingTheirFirstDimension) {
  artifact::v1::Frame frame = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { symbol: 0 } dims { static_size: 8 } } }
      guards { parameter: 1 tensor { dims { symbol: 0 } dims { static_size: 8 } } }
      outputs { shape: [-1, 2] shape_symbols: [0, -1] }
    }
    variants {
      id: "forward#1"
      guards { parameter: 0 tensor { dims { static_size: 4 } dims { static_size: 8 } } }
      guards { parameter: 1 tensor { dims { static_size: 4 } dims { static_size: 8 } } }
      outputs { shape: [4, 2] }
    }
  )pb"));
  EXPECT_TRUE(CheckBatchable(frame).ok()) << CheckBatchable(frame);
}

TEST(CheckBatchable, RefusesAVariantWhoseTensorsHaveNoCommonBatch) {
  artifact::v1::Frame independent = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { symbol: 0 } } }
      guards { parameter: 1 tensor { dims { symbol: 1 } } }
      outputs { shape: [-1] }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(independent).message(),
              AllOf(HasSubstr("variant forward#0"),
                    HasSubstr("inputs 'input_ids' and 'attention_mask'"),
                    HasSubstr("the same first dimension")));

  artifact::v1::Frame sizes = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { static_size: 2 } } }
      guards { parameter: 1 tensor { dims { static_size: 3 } } }
      outputs { shape: [2] }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(sizes).message(), HasSubstr("the same first dimension"));

  artifact::v1::Frame scalar_input = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { symbol: 0 } } }
      guards { parameter: 1 tensor { } }
      outputs { shape: [-1] }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(scalar_input).message(),
              HasSubstr("takes input 'attention_mask' as a scalar"));

  artifact::v1::Frame scalar_output = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { symbol: 0 } } }
      guards { parameter: 1 tensor { dims { symbol: 0 } } }
      outputs { }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(scalar_output).message(),
              HasSubstr("returns output 'logits' as a scalar"));

  // x[: x.size(0) // 2]: half the rows.
  artifact::v1::Frame halved = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { static_size: 8 } } }
      guards { parameter: 1 tensor { dims { static_size: 8 } } }
      outputs { shape: [4] }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(halved).message(),
              HasSubstr("returns output 'logits' whose first dimension is not its inputs' "
                        "rows (input_ids.size(0))"));
  artifact::v1::Frame halved_symbol = FrameFrom(absl::StrCat(kTwoInputs, R"pb(
    variants {
      id: "forward#0"
      guards { parameter: 0 tensor { dims { symbol: 0 } } }
      guards { parameter: 1 tensor { dims { symbol: 0 } } }
      outputs { shape: [-1] shape_symbols: [-1] }
    }
  )pb"));
  EXPECT_THAT(CheckBatchable(halved_symbol).message(), HasSubstr("not its inputs' rows"));
  EXPECT_EQ(CheckBatchable(scalar_output).code(), absl::StatusCode::kFailedPrecondition);
}

// A float32 tensor argument over `values`, of shape `shape`.
NamedValue Tensor(const std::string& name, std::vector<int64_t> shape,
                  const std::vector<float>& values) {
  TensorArg t;
  t.dtype = DType::kFloat32;
  t.shape = std::move(shape);
  t.data = values.data();
  t.nbytes = values.size() * sizeof(float);
  return {name, t};
}

TEST(BatchRows, IsTheFirstDimensionEveryTensorShares) {
  std::vector<float> a(6), b(2);
  auto rows = BatchRows({Tensor("x", {2, 3}, a), Tensor("m", {2, 1}, b), {"k", int64_t{4}}},
                        "bert", 8);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(*rows, 2);

  EXPECT_THAT(BatchRows({Tensor("x", {2, 3}, a), Tensor("m", {1, 2}, b)}, "bert", 8)
                  .status()
                  .message(),
              HasSubstr("inputs 'x' and 'm' of model 'bert' disagree on their rows"));
  EXPECT_THAT(BatchRows({Tensor("x", {}, a)}, "bert", 8).status().message(),
              HasSubstr("input 'x' has no dimensions"));
  auto too_many = BatchRows({Tensor("x", {2, 3}, a)}, "bert", 1);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.status().message(),
              AllOf(HasSubstr("has 2 rows"), HasSubstr("max_batch_size 1")));
  EXPECT_THAT(BatchRows({{"k", int64_t{4}}}, "bert", 8).status().message(),
              HasSubstr("sends no tensor"));
}

TEST(BatchKey, IgnoresRowsAndOrderButNothingElse) {
  std::vector<float> data(64);
  const std::string key =
      BatchKey("m", 1, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data), {"k", 0.5}});
  EXPECT_EQ(key, BatchKey("m", 1, {{"k", 0.5}, Tensor("y", {7, 5}, data),
                                    Tensor("x", {7, 3}, data)}));
  EXPECT_NE(key, BatchKey("m", 2, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data),
                                    {"k", 0.5}}));
  EXPECT_NE(key, BatchKey("n", 1, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data),
                                    {"k", 0.5}}));
  EXPECT_NE(key, BatchKey("m", 1, {Tensor("x", {2, 4}, data), Tensor("y", {2, 5}, data),
                                    {"k", 0.5}}));
  EXPECT_NE(key, BatchKey("m", 1, {Tensor("x", {2, 3, 1}, data), Tensor("y", {2, 5}, data),
                                    {"k", 0.5}}));
  EXPECT_NE(key, BatchKey("m", 1, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data),
                                    {"k", 0.25}}));
  EXPECT_NE(key, BatchKey("m", 1, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data),
                                    {"k", int64_t{0}}}));
  EXPECT_NE(key, BatchKey("m", 1, {Tensor("x", {2, 3}, data), Tensor("y", {2, 5}, data)}));
  NamedValue doubles = Tensor("x", {2, 3}, data);
  std::get<TensorArg>(doubles.value).dtype = DType::kFloat64;
  EXPECT_NE(key, BatchKey("m", 1, {doubles, Tensor("y", {2, 5}, data), {"k", 0.5}}));
  // Strings are delimited by their length: "a" + "b|" is not "a|" + "b".
  EXPECT_NE(BatchKey("m", 1, {{"s", std::string("a")}, {"t", std::string("b|")}}),
            BatchKey("m", 1, {{"s", std::string("a|")}, {"t", std::string("b")}}));
}

TEST(MergeRows, StacksEachInputsRowsInTheRequestsOrder) {
  const std::vector<float> x1 = {1, 2}, y1 = {10};
  const std::vector<float> x2 = {3, 4, 5, 6}, y2 = {20, 30};
  const std::vector<NamedValue> first = {Tensor("x", {1, 2}, x1), Tensor("y", {1, 1}, y1),
                                         {"k", int64_t{3}}};
  // The second request lists its inputs the other way round.
  const std::vector<NamedValue> second = {Tensor("y", {2, 1}, y2), {"k", int64_t{3}},
                                          Tensor("x", {2, 2}, x2)};
  const std::vector<absl::Span<const NamedValue>> requests = {first, second};
  MergedArguments merged = MergeRows(requests);
  ASSERT_EQ(merged.args.size(), 3u);
  const TensorArg& x = std::get<TensorArg>(merged.args[0].value);
  EXPECT_EQ(merged.args[0].name, "x");
  EXPECT_THAT(x.shape, ElementsAre(3, 2));
  ASSERT_EQ(x.nbytes, 6 * sizeof(float));
  std::vector<float> xs(6);
  std::memcpy(xs.data(), x.data, x.nbytes);
  EXPECT_THAT(xs, ElementsAre(1, 2, 3, 4, 5, 6));
  const TensorArg& y = std::get<TensorArg>(merged.args[1].value);
  std::vector<float> ys(3);
  ASSERT_EQ(y.nbytes, 3 * sizeof(float));
  std::memcpy(ys.data(), y.data, y.nbytes);
  EXPECT_THAT(ys, ElementsAre(10, 20, 30));
  EXPECT_EQ(std::get<int64_t>(merged.args[2].value), 3);
}

TEST(FirstRow, PadsAMergedCallWithTheRequestsFirstRowCopiedOnce) {
  const std::vector<float> x = {1, 2, 3, 4}, y = {10, 20};
  const std::vector<NamedValue> request = {Tensor("x", {2, 2}, x), {"k", int64_t{3}},
                                           Tensor("y", {2, 1}, y)};
  const std::vector<NamedValue> first_row = FirstRow(request);
  ASSERT_EQ(first_row.size(), 3u);
  const TensorArg& row_x = std::get<TensorArg>(first_row[0].value);
  EXPECT_THAT(row_x.shape, ElementsAre(1, 2));
  EXPECT_EQ(row_x.nbytes, 2 * sizeof(float));
  EXPECT_EQ(row_x.data, x.data()) << "a view of the request's bytes, not a copy";
  EXPECT_EQ(std::get<int64_t>(first_row[1].value), 3);

  const std::vector<absl::Span<const NamedValue>> padded = {request, first_row, first_row};
  EXPECT_EQ(StackedBytes(padded), 8 * sizeof(float) + 4 * sizeof(float));
  MergedArguments merged = MergeRows(padded);
  const TensorArg& px = std::get<TensorArg>(merged.args[0].value);
  EXPECT_THAT(px.shape, ElementsAre(4, 2));
  ASSERT_EQ(px.nbytes, 8 * sizeof(float));
  std::vector<float> xs(8);
  std::memcpy(xs.data(), px.data, px.nbytes);
  EXPECT_THAT(xs, ElementsAre(1, 2, 3, 4, 1, 2, 1, 2));
  const TensorArg& py = std::get<TensorArg>(merged.args[2].value);
  std::vector<float> ys(4);
  ASSERT_EQ(py.nbytes, 4 * sizeof(float));
  std::memcpy(ys.data(), py.data, py.nbytes);
  EXPECT_THAT(ys, ElementsAre(10, 20, 10, 10));
}

// Variants at batches 8 and 1, from 2 up, 8 again, and one more than a
// symbol from 2 up; symbol 1's range is not the batch's.
constexpr char kBatchVariants[] = R"pb(
  variants { guards { parameter: 0 tensor { dims { static_size: 8 } dims { static_size: 8 } } } }
  variants {
    guards { parameter: 0 tensor { dims { symbol: 0 } dims { static_size: 8 } } }
    symbols { symbol: 1 min: 5 }
    symbols { symbol: 0 min: 2 }
  }
  variants {
    guards { parameter: 1 tensor { is_none: true } }
    guards { parameter: 0 tensor { dims { static_size: 1 } dims { static_size: 8 } } }
  }
  variants { guards { parameter: 0 tensor { dims { static_size: 8 } dims { static_size: 4 } } } }
  variants {
    guards { parameter: 0 tensor { dims { symbol: 3 symbol_offset: 1 } dims { static_size: 4 } } }
    symbols { symbol: 3 min: 2 }
  }
)pb";

TEST(PaddingBatchSizes, ListsTheStaticBatchesAndEachDynamicBatchsSmallestOnce) {
  const artifact::v1::Frame frame = FrameFrom(absl::StrCat(kTwoInputs, kBatchVariants));
  EXPECT_THAT(PaddingBatchSizes(frame), ElementsAre(1, 2, 3, 8));
}

TEST(PaddingTargets, PadsAtMostToTwiceTheRowsAndTheLimit) {
  const artifact::v1::Frame frame = FrameFrom(absl::StrCat(kTwoInputs, kBatchVariants));
  EXPECT_THAT(PaddingTargets(frame, 1, 16), ElementsAre(2));
  EXPECT_THAT(PaddingTargets(frame, 2, 16), ElementsAre(3));
  EXPECT_THAT(PaddingTargets(frame, 4, 16), ElementsAre(8));
  EXPECT_THAT(PaddingTargets(frame, 4, 7), ElementsAre());
  EXPECT_THAT(PaddingTargets(frame, 8, 16), ElementsAre());
}

OutputTensor Output(std::vector<int64_t> shape, const std::vector<float>& values) {
  OutputTensor out;
  out.shape = std::move(shape);
  out.data = values.data();
  out.nbytes = values.size() * sizeof(float);
  return out;
}

std::vector<float> Values(const OutputTensor& t) {
  std::vector<float> v(t.nbytes / sizeof(float));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

TEST(SplitRows, GivesEachRequestItsRowsOfEveryOutput) {
  const std::vector<float> logits = {1, 2, 3, 4, 5, 6}, pooled = {7, 8, 9};
  auto split = SplitRows({Output({3, 2}, logits), Output({3}, pooled)}, {1, 2});
  ASSERT_TRUE(split.has_value());
  ASSERT_EQ(split->size(), 2u);
  EXPECT_THAT((*split)[0][0].shape, ElementsAre(1, 2));
  EXPECT_THAT(Values((*split)[0][0]), ElementsAre(1, 2));
  EXPECT_THAT(Values((*split)[0][1]), ElementsAre(7));
  EXPECT_THAT((*split)[1][0].shape, ElementsAre(2, 2));
  EXPECT_THAT(Values((*split)[1][0]), ElementsAre(3, 4, 5, 6));
  EXPECT_THAT(Values((*split)[1][1]), ElementsAre(8, 9));
}

TEST(SplitRows, RefusesOutputsThatDoNotKeepTheRows) {
  const std::vector<float> values = {1, 2, 3, 4};
  EXPECT_FALSE(SplitRows({Output({4}, values)}, {1, 2}).has_value());
  EXPECT_FALSE(SplitRows({Output({2, 2}, values)}, {1, 2}).has_value());
  const std::vector<float> scalar = {1};
  EXPECT_FALSE(SplitRows({Output({}, scalar)}, {1}).has_value());
}

}  // namespace
}  // namespace precompile::server
