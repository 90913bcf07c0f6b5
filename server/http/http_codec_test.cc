#include "server/http/http_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/json_text.h"
#include "server/api/tensor_codec.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;

TEST(HttpStatusOf, MapsCodesAsGoogleApisDo) {
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kFailedPrecondition), 400);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInternal), 500);
}

TEST(ParseHeaderLength, TakesADecimalCountNoLargerThanTheBody) {
  EXPECT_EQ(*ParseHeaderLength("12", 20), 12u);
  EXPECT_EQ(*ParseHeaderLength("20", 20), 20u);
  EXPECT_THAT(ParseHeaderLength("21", 20).status().message(), HasSubstr("says 21 bytes"));
  for (const char* bad : {"", "-1", "1e3", " 3", "0x10", "99999999999999999999999"}) {
    EXPECT_FALSE(ParseHeaderLength(bad, 100).ok()) << bad;
  }
}

template <typename T>
std::vector<T> Values(const std::string& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

TEST(DecodeInferRequest, JsonDataOfEveryKindBecomesRawLittleEndianBytes) {
  const std::string body = R"({
    "id": "r1",
    "parameters": {"n": 3, "scale": 0.5, "check": true, "mode": "sum"},
    "inputs": [
      {"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2.5], [-3, "NaN"]]},
      {"name": "i", "shape": [3], "datatype": "INT8", "data": [-128, 0, 127]},
      {"name": "b", "shape": [2], "datatype": "BOOL", "data": [true, false]},
      {"name": "h", "shape": [1], "datatype": "FP16", "data": [1.0]},
      {"name": "l", "shape": [1], "datatype": "INT64", "data": [9007199254740993]}
    ],
    "outputs": [{"name": "y", "parameters": {"binary_data": true}}]
  })";
  inference::ModelInferRequest request;
  ASSERT_TRUE(DecodeInferRequest(body, std::nullopt, "m", "2", &request).ok());
  EXPECT_EQ(request.model_name(), "m");
  EXPECT_EQ(request.model_version(), "2");
  EXPECT_EQ(request.id(), "r1");
  EXPECT_EQ(request.parameters().at("n").int64_param(), 3);
  EXPECT_EQ(request.parameters().at("scale").double_param(), 0.5);
  EXPECT_TRUE(request.parameters().at("check").bool_param());
  EXPECT_EQ(request.parameters().at("mode").string_param(), "sum");
  ASSERT_EQ(request.raw_input_contents_size(), 5);
  std::vector<float> x = Values<float>(request.raw_input_contents(0));
  ASSERT_EQ(x.size(), 4u);
  EXPECT_EQ(x[1], 2.5f);
  EXPECT_EQ(x[2], -3.0f);
  EXPECT_TRUE(std::isnan(x[3]));
  EXPECT_EQ(Values<int8_t>(request.raw_input_contents(1)), (std::vector<int8_t>{-128, 0, 127}));
  EXPECT_EQ(Values<uint8_t>(request.raw_input_contents(2)), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(Values<uint16_t>(request.raw_input_contents(3)), (std::vector<uint16_t>{0x3c00}));
  EXPECT_EQ(Values<int64_t>(request.raw_input_contents(4)),
            (std::vector<int64_t>{9007199254740993}));
  ASSERT_EQ(request.outputs_size(), 1);
  EXPECT_TRUE(request.outputs(0).parameters().at("binary_data").bool_param());
}

TEST(DecodeInferRequest, BinaryDataFollowsTheJsonInInputOrder) {
  const std::string json = R"({"inputs": [
      {"name": "a", "shape": [2], "datatype": "INT32", "parameters": {"binary_data_size": 8}},
      {"name": "b", "shape": [1], "datatype": "FP64", "data": [0.25]},
      {"name": "c", "shape": [3], "datatype": "UINT8", "parameters": {"binary_data_size": 3}}]})";
  const int32_t a[] = {7, -9};
  std::string body = json;
  body.append(reinterpret_cast<const char*>(a), sizeof(a));
  body.append("\x01\x02\x03", 3);
  inference::ModelInferRequest request;
  ASSERT_TRUE(DecodeInferRequest(body, json.size(), "m", "", &request).ok());
  EXPECT_EQ(Values<int32_t>(request.raw_input_contents(0)), (std::vector<int32_t>{7, -9}));
  EXPECT_EQ(Values<double>(request.raw_input_contents(1)), (std::vector<double>{0.25}));
  EXPECT_EQ(request.raw_input_contents(2), "\x01\x02\x03");
}

// Four inputs of 2^62 bytes each add up to 2^64, which wraps to 0 in 64
// bits: the sizes must be compared one by one against what is there, before
// any storage is made for them.
TEST(DecodeInferRequest, RefusesBinarySizesWhoseSumWrapsPast2To64) {
  std::string json = R"({"inputs": [)";
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&json, i ? "," : "", R"({"name": "in)", i,
                    R"(", "shape": [4611686018427387904], "datatype": "UINT8",
                    "parameters": {"binary_data_size": 4611686018427387904}})");
  }
  json += "]}";
  for (const std::string& binary : {std::string(), std::string("abc")}) {
    inference::ModelInferRequest request;
    absl::Status status = DecodeInferRequest(json + binary, json.size(), "m", "", &request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("input 'in0' has binary_data_size 4611686018427387904, but "
                                       "only ", binary.size(), " bytes")));
    EXPECT_EQ(request.raw_input_contents_size(), 0);
  }
}

// Each bad request is refused with a message naming the problem.
TEST(DecodeInferRequest, RefusesWhatDoesNotAgreeAndSaysWhat) {
  struct Case {
    std::string body;
    std::optional<size_t> header;
    const char* message;
  };
  const std::string two_ints =
      R"({"inputs":[{"name":"a","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}}]})";
  const Case cases[] = {
      {"{", std::nullopt, "invalid JSON"},
      {"[]", std::nullopt, "must be a JSON object"},
      {R"({"input": []})", std::nullopt, "unknown member \"input\""},
      {R"({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]})", std::nullopt,
       "needs a \"name\""},
      {R"({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]})",
       std::nullopt, "has 2 values but shape [3] needs 3"},
      {R"({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": []}]})",
       std::nullopt, "negative dimension"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]})",
       std::nullopt, "datatype 'BYTES'"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [300]}]})",
       std::nullopt, "value 300 at index 0 does not fit INT8"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]})",
       std::nullopt, "is not an integer"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP16", "data": [70000]}]})",
       std::nullopt, "does not fit FP16"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [1]}]})",
       std::nullopt, "is not true or false"},
      {R"({"inputs": [{"name": "x", "shape": [4611686018427387904, 4], "datatype": "FP32",
           "parameters": {"binary_data_size": 16}}]})",
       std::nullopt, "more elements than any request can carry"},
      {R"({"inputs": [{"name": "x", "shape": [0, 3, 4611686018427387904, 40], "datatype": "FP32",
           "data": []}]})",
       std::nullopt, "input 'x' has shape [0, 3, 4611686018427387904, 40], more elements"},
      {R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]})", std::nullopt,
       "no \"data\" and no binary_data_size"},
      {two_ints + "1234567", two_ints.size(),
       "input 'a' has binary_data_size 8, but only 7 bytes of binary data follow"},
      {two_ints + "123456789", two_ints.size(), "add up to 8 bytes but 9 bytes follow"},
      {R"({"inputs":[{"name":"a","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":4}}]})",
       std::nullopt, "binary_data_size 4 but shape [2] of INT32 needs 8 bytes"},
      {R"({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": 3}}]})",
       std::nullopt, "classification extension"},
      {R"({"inputs": [], "parameters": {"p": [1]}})", std::nullopt,
       "must be a bool, a number or a string"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest request;
    absl::Status status = DecodeInferRequest(c.body, c.header, "m", "", &request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.body;
  }
}

// The values of "data" are written as they stream by; nesting is only
// row-major order, and the order of an input's members does not matter.
TEST(DecodeInferRequest, DataInAnyNestingAndMemberOrderBecomesTheSameBytes) {
  const std::string body = R"({"inputs": [
      {"name": "a", "shape": [4], "datatype": "INT32", "data": [[], [1, [2]], [[3, 4]], []]},
      {"data": [[5], 6], "name": "b", "datatype": "INT16", "shape": [2]},
      {"name": "c", "data": [7.5], "shape": [1], "datatype": "FP64"}]})";
  inference::ModelInferRequest request;
  const absl::Status status = DecodeInferRequest(body, std::nullopt, "m", "", &request);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Values<int32_t>(request.raw_input_contents(0)), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(Values<int16_t>(request.raw_input_contents(1)), (std::vector<int16_t>{5, 6}));
  EXPECT_EQ(Values<double>(request.raw_input_contents(2)), (std::vector<double>{7.5}));
}

TEST(DecodeInferRequest, RefusesJsonThatWouldCostMoreThanItsTensors) {
  auto refusal = [](const std::string& body) {
    inference::ModelInferRequest request;
    return DecodeInferRequest(body, std::nullopt, "m", "", &request);
  };
  // Values that are no tensor's: a parameter of 100001 numbers.
  std::string outputs;
  for (int i = 0; i < 100001; ++i) absl::StrAppend(&outputs, i ? "," : "", "1");
  absl::Status status = refusal(absl::StrCat(R"({"inputs": [], "parameters": {"p": [)", outputs, "]}}"));
  EXPECT_THAT(status.message(), HasSubstr("more than 100000 values outside the inputs' \"data\""));
  // Values before the datatype and shape that say what they are.
  std::string values;
  for (int i = 0; i < (1 << 20) + 1; ++i) absl::StrAppend(&values, i ? "," : "", "0");
  status = refusal(absl::StrCat(R"({"inputs": [{"name": "x", "data": [)", values,
                                R"(], "shape": [1048577], "datatype": "UINT8"}]})"));
  EXPECT_THAT(status.message(), HasSubstr("input 'x' has more than 1048576 values in \"data\" "
                                          "before its \"datatype\" and \"shape\""));
  // The same values after them are written as they come.
  status = refusal(absl::StrCat(R"({"inputs": [{"name": "x", "shape": [1048577], "datatype": "UINT8",
                                "data": [)", values, "]}]}"));
  EXPECT_TRUE(status.ok()) << status;
  // Brackets without values: nlohmann's parser would keep every one.
  std::string empties;
  for (int i = 0; i < 30000; ++i) empties += "[],";
  status = refusal(absl::StrCat(R"({"inputs": [{"name": "x", "shape": [0], "datatype": "FP32", "data": [)",
                                empties, "[]]}]}"));
  EXPECT_THAT(status.message(), HasSubstr("more than 65536 bytes of brackets, commas and blanks"));
  status = refusal(R"({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [{}]}]})");
  EXPECT_THAT(status.message(), HasSubstr("input 'x': value at index 0 is an object"));
  status = refusal(R"({"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}]})");
  EXPECT_THAT(status.message(), HasSubstr("has 5 values but shape [3] needs 3"));
  status = refusal(R"({"inputs": [{"name": "x", "name": "y", "shape": [1], "datatype": "FP32", "data": [1]}]})");
  EXPECT_THAT(status.message(), HasSubstr("the key \"name\" is given twice"));
}

OutputTensor Tensor(DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  OutputTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

TEST(EncodeInferResponse, SendsJsonValuesOrBinaryAsEachOutputAsks) {
  inference::ModelInferRequest request;
  request.add_outputs()->set_name("bytes");
  (*request.mutable_outputs(0)->mutable_parameters())["binary_data"].set_bool_param(true);
  inference::ModelInferResponse response;
  response.set_model_name("m");
  response.set_model_version("1");
  (*response.mutable_parameters())["precompile_outcome"].set_string_param("variant");
  const float f[] = {0.1f, -2.0f, INFINITY};
  const uint16_t h[] = {0x3555};  // The half nearest 1/3.
  const int64_t i[] = {-5, 9007199254740993};
  const char bytes[] = {'\x01', '\x02'};
  auto add = [&](const char* name, const char* datatype, int64_t n) {
    auto* o = response.add_outputs();
    o->set_name(name);
    o->set_datatype(datatype);
    o->add_shape(n);
  };
  add("f", "FP32", 3);
  add("h", "FP16", 1);
  add("i", "INT64", 2);
  add("bytes", "UINT8", 2);
  const std::vector<OutputTensor> outputs = {
      Tensor(DType::kFloat32, {3}, f, sizeof(f)), Tensor(DType::kFloat16, {1}, h, sizeof(h)),
      Tensor(DType::kInt64, {2}, i, sizeof(i)), Tensor(DType::kUInt8, {2}, bytes, 2)};
  HttpInferResponse encoded = EncodeInferResponse(request, response, outputs);
  ASSERT_TRUE(encoded.header_length.has_value());
  const std::string body(encoded.body);
  EXPECT_EQ(body.substr(*encoded.header_length), "\x01\x02");
  absl::StatusOr<Json> json = ParseJson(body.substr(0, *encoded.header_length));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["parameters"]["precompile_outcome"], "variant");
  const Json& outs = (*json)["outputs"];
  EXPECT_EQ(DumpJson(outs[0]["data"], false), R"([0.1,-2.0,"Infinity"])");
  EXPECT_EQ(DumpJson(outs[1]["data"], false), "[0.33325]");
  EXPECT_EQ(outs[2]["data"][1].get<int64_t>(), 9007199254740993);
  EXPECT_EQ(outs[3]["parameters"]["binary_data_size"], 2);
  EXPECT_EQ(JsonMember(outs[3], "data"), nullptr);

  // Without a binary output the body is all JSON.
  request.mutable_outputs(0)->clear_parameters();
  EXPECT_FALSE(EncodeInferResponse(request, response, outputs).header_length.has_value());
}

// A large binary output is sent from its tensor, which the body holds until
// it is gone; a small one is copied (the tensor may go at once).
TEST(EncodeInferResponse, SendsLargeBinaryOutputsFromTheirTensors) {
  inference::ModelInferRequest request;
  (*request.mutable_parameters())["binary_data_output"].set_bool_param(true);
  inference::ModelInferResponse response;
  for (const char* name : {"small", "large"}) {
    auto* o = response.add_outputs();
    o->set_name(name);
    o->set_datatype("UINT8");
  }
  auto small = std::make_shared<std::string>(16, 's');
  auto large = std::make_shared<std::string>(kReferencedOutputBytes, 'L');
  response.mutable_outputs(0)->add_shape(small->size());
  response.mutable_outputs(1)->add_shape(large->size());
  std::vector<OutputTensor> outputs = {Tensor(DType::kUInt8, {16}, small->data(), small->size()),
                                       Tensor(DType::kUInt8, {8192}, large->data(), large->size())};
  outputs[0].owner = small;
  outputs[1].owner = large;
  auto encoded = std::make_optional(EncodeInferResponse(request, response, outputs));
  outputs.clear();
  EXPECT_EQ(small.use_count(), 1);
  EXPECT_EQ(large.use_count(), 2);
  const std::string body(encoded->body);
  ASSERT_TRUE(encoded->header_length.has_value());
  EXPECT_EQ(body.substr(*encoded->header_length), *small + *large);
  bool large_borrowed = false;
  for (absl::string_view chunk : encoded->body.Chunks()) {
    large_borrowed |= chunk.data() == large->data();
  }
  EXPECT_TRUE(large_borrowed) << "the large output was copied";
  encoded.reset();
  EXPECT_EQ(large.use_count(), 1);
}

}  // namespace
}  // namespace precompile::server
