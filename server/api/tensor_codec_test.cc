#include "server/api/tensor_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

inference::ModelInferRequest OneInput(const std::string& datatype,
                                      std::vector<int64_t> shape) {
  inference::ModelInferRequest request;
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype(datatype);
  for (int64_t d : shape) input->add_shape(d);
  return request;
}

template <typename T>
std::vector<T> Values(const TensorArg& t) {
  std::vector<T> values(t.nbytes / sizeof(T));
  std::memcpy(values.data(), t.data, t.nbytes);
  return values;
}

TEST(TensorCodec, MapsEveryServedDatatype) {
  const std::vector<std::pair<std::string, DType>> expected = {
      {"BOOL", DType::kBool},     {"UINT8", DType::kUInt8},     {"INT8", DType::kInt8},
      {"INT16", DType::kInt16},   {"INT32", DType::kInt32},     {"INT64", DType::kInt64},
      {"FP16", DType::kFloat16},  {"BF16", DType::kBFloat16},   {"FP32", DType::kFloat32},
      {"FP64", DType::kFloat64}};
  for (const auto& [name, dtype] : expected) {
    EXPECT_EQ(DTypeFromDatatype(name), dtype) << name;
    EXPECT_EQ(DatatypeOf(dtype), name);
    EXPECT_NE(ConfigDataTypeOf(dtype), inference::TYPE_INVALID);
  }
  EXPECT_FALSE(DTypeFromDatatype("BYTES").has_value());
  EXPECT_FALSE(DTypeFromDatatype("fp32").has_value());
}

TEST(TensorCodec, BorrowsRawContentsWithoutCopying) {
  inference::ModelInferRequest request = OneInput("BF16", {2, 3});
  request.add_raw_input_contents(std::string(12, '\x01'));
  std::string storage;
  absl::StatusOr<TensorArg> t = DecodeInput(request, 0, &storage);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->dtype, DType::kBFloat16);
  EXPECT_THAT(t->shape, ElementsAre(2, 3));
  EXPECT_EQ(t->data, request.raw_input_contents(0).data());
  EXPECT_TRUE(storage.empty());
}

TEST(TensorCodec, ConvertsTypedContents) {
  inference::ModelInferRequest ints = OneInput("INT16", {3});
  for (int v : {-2, 0, 300}) ints.mutable_inputs(0)->mutable_contents()->add_int_contents(v);
  std::string storage;
  absl::StatusOr<TensorArg> t = DecodeInput(ints, 0, &storage);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(Values<int16_t>(*t), ElementsAre(-2, 0, 300));

  inference::ModelInferRequest bools = OneInput("BOOL", {2});
  bools.mutable_inputs(0)->mutable_contents()->add_bool_contents(true);
  bools.mutable_inputs(0)->mutable_contents()->add_bool_contents(false);
  t = DecodeInput(bools, 0, &storage);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->nbytes, 2u);
  EXPECT_EQ(static_cast<const uint8_t*>(t->data)[0], 1);
  EXPECT_EQ(static_cast<const uint8_t*>(t->data)[1], 0);

  inference::ModelInferRequest doubles = OneInput("FP64", {1, 1});
  doubles.mutable_inputs(0)->mutable_contents()->add_fp64_contents(2.5);
  t = DecodeInput(doubles, 0, &storage);
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(Values<double>(*t), ElementsAre(2.5));
}

TEST(TensorCodec, RefusesWhatCannotBeDecoded) {
  struct Case {
    inference::ModelInferRequest request;
    std::string message;
  };
  std::vector<Case> cases;
  {
    auto r = OneInput("INT8", {1});
    r.mutable_inputs(0)->mutable_contents()->add_int_contents(200);
    cases.push_back({r, "value 200 at index 0 does not fit its datatype"});
  }
  {
    auto r = OneInput("FP32", {2, 2});
    r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
    cases.push_back({r, "has 1 values but shape [2, 2] needs 4"});
  }
  {
    auto r = OneInput("FP16", {1});
    cases.push_back({r, "FP16, which travels only in raw_input_contents"});
  }
  {
    auto r = OneInput("FP32", {2});
    r.add_raw_input_contents(std::string(8, '\0'));
    r.mutable_inputs(0)->mutable_contents()->add_fp32_contents(1);
    cases.push_back({r, "has both raw and typed contents"});
  }
  {
    auto r = OneInput("INT64", {int64_t{1} << 31, int64_t{1} << 31, int64_t{1} << 31});
    r.add_raw_input_contents("");
    cases.push_back({r, "more elements than any request can carry"});
  }
  {
    // 2^61 doubles are 2^64 bytes: a byte count that would wrap to 0 and
    // let an empty buffer pass (found by the request decoding fuzzer).
    auto r = OneInput("FP64", {int64_t{1} << 61});
    r.add_raw_input_contents("");
    cases.push_back({r, "more elements than any request can carry"});
  }
  {
    // No elements, but strides past 2^64: libtorch computes an empty
    // tensor's strides from its other sizes (once a 500 "Stride
    // calculation overflowed", after the request was decoded).
    auto r = OneInput("FP32", {0, 3, int64_t{1} << 62, 40});
    r.add_raw_input_contents("");
    cases.push_back({r, "input 'x' has shape [0, 3, 4611686018427387904, 40], more elements"});
  }
  {
    // A second input whose data is in its contents, beside a raw first.
    auto r = OneInput("FP32", {1});
    r.add_raw_input_contents(std::string(4, '\0'));
    auto* typed = r.add_inputs();
    typed->set_name("y");
    typed->set_datatype("FP32");
    typed->add_shape(1);
    typed->mutable_contents()->add_fp32_contents(1);
    cases.push_back({r,
                     "the request has 2 inputs but 1 raw_input_contents: either every input's "
                     "data is in raw_input_contents, in the inputs' order, or every input's is "
                     "in its own contents"});
  }
  {
    auto r = OneInput("STRING", {1});
    cases.push_back({r, "datatype 'STRING', which is not one of BOOL"});
  }
  for (const Case& c : cases) {
    std::string storage;
    absl::StatusOr<TensorArg> t = DecodeInput(c.request, 0, &storage);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(t.status().message(), HasSubstr(c.message));
  }
}

TEST(TensorCodec, DescribesOutputsWithoutTheirBytes) {
  const std::vector<float> values = {1.5f, -2.0f};
  OutputTensor out;
  out.dtype = DType::kBFloat16;
  out.shape = {2, 1};
  out.data = values.data();
  out.nbytes = 4;
  inference::ModelInferResponse response;
  DescribeOutput(out, "output0", &response);
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "output0");
  EXPECT_EQ(response.outputs(0).datatype(), "BF16");
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(2, 1));
  EXPECT_EQ(response.raw_output_contents_size(), 0);
}

}  // namespace
}  // namespace precompile::server
