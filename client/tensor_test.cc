// Client tensors, half/bfloat16 conversions, and tensors and scalars as
// JSON (tensor_json.h, json_text.h).
#include "client/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "base/json_text.h"
#include "client/tensor_json.h"

namespace precompile::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TensorTest, ValidatesSizes) {
  EXPECT_EQ(*ElementSize("FP64"), 8);
  EXPECT_THAT(ElementSize("BYTES").status().message(), HasSubstr("not supported"));
  EXPECT_THAT(ElementSize("FP8").status().message(), HasSubstr("unknown datatype 'FP8'"));
  EXPECT_EQ(*ElementCount({}), 1);
  EXPECT_EQ(*ElementCount({2, 0}), 0);
  EXPECT_FALSE(ElementCount({-1}).ok());
  EXPECT_FALSE(ElementCount({int64_t{1} << 40, int64_t{1} << 40}).ok());
  EXPECT_TRUE(ValidateTensor({"x", "INT16", {2}, std::string(4, '\0')}).ok());
  EXPECT_THAT(ValidateTensor({"x", "INT16", {2}, std::string(3, '\0')}).message(),
              HasSubstr("tensor 'x' has 3 bytes but shape [2] of INT16 needs 4"));
}

TEST(TensorJsonTest, BuildsTensorsFromSpecs) {
  std::mt19937_64 rng(1);
  auto tensor = [&](const std::string& spec) { return TensorFromJson("x", *ParseJson(spec), rng); };
  absl::StatusOr<Tensor> t = tensor(R"({"shape": [2, 2], "datatype": "INT64",
                                        "data": [[1, -2], [9007199254740993, 4]]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(ElementAsInt64(*t, 2), 9007199254740993);  // beyond 2^53: kept exactly
  t = tensor(R"({"shape": [3], "data": [0.5, "NaN", "-Infinity"]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->datatype, "FP32");
  EXPECT_EQ(ElementAsDouble(*t, 0), 0.5);
  EXPECT_TRUE(std::isnan(ElementAsDouble(*t, 1)));
  EXPECT_EQ(DumpJson(TensorValuesJson(*t), false), R"([0.5,"NaN","-Infinity"])");
  t = tensor(R"({"shape": [2], "datatype": "BOOL", "data": [true, 0]})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(DumpJson(TensorValuesJson(*t), false), "[true,false]");
  t = tensor(R"({"shape": [2], "datatype": "FP16", "fill": "ones"})");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(DumpJson(TensorValuesJson(*t), false), "[1.0,1.0]");
  t = tensor(R"({"shape": [1000], "datatype": "INT8", "fill": "random"})");
  ASSERT_TRUE(t.ok()) << t.status();
  std::set<int64_t> drawn;
  for (int i = 0; i < 1000; ++i) drawn.insert(ElementAsInt64(*t, i));
  EXPECT_EQ(drawn, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  t = tensor(R"({"shape": [4, 4], "fill": 2.5})");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(ElementAsDouble(*t, 15), 2.5);

  const std::vector<std::pair<std::string, std::string>> errors = {
      {R"([1])", "expected a JSON object"},
      {R"({"shape": [2], "data": [1, 2], "fill": "ones"})", "exactly one of"},
      {R"({"shape": [2], "datatype": "INT8", "data": [1, 300]})",
       "value 1 as INT8: 300 does not fit"},
      {R"({"shape": [1], "datatype": "INT32", "data": [1.5]})", "expected an integer, got 1.5"},
      {R"({"shape": [1], "datatype": "UINT8", "data": [-1]})", "expected a non-negative integer"},
      {R"({"shape": [1], "datatype": "BOOL", "data": [2]})", "expected true, false, 0 or 1"},
      {R"({"shape": [-1], "data": []})", "dimensions must be integers >= 0"},
      {R"({"shape": [2], "data": [1, 2], "dtype": "FP32"})", "unknown field \"dtype\""},
      {R"({"shape": [2], "datatype": "STRING", "data": [1, 2]})", "unknown datatype 'STRING'"},
  };
  for (const auto& [spec, message] : errors) {
    absl::StatusOr<Tensor> bad = tensor(spec);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(bad.status().message(), HasSubstr(message)) << spec;
  }
}

TEST(TensorJsonTest, InfersScalarTypes) {
  EXPECT_EQ(std::get<int64_t>(ScalarFromText("3")), 3);
  EXPECT_EQ(std::get<int64_t>(ScalarFromText("-12")), -12);
  EXPECT_EQ(std::get<double>(ScalarFromText("0.5")), 0.5);
  EXPECT_EQ(std::get<double>(ScalarFromText("1e-3")), 1e-3);
  EXPECT_EQ(std::get<double>(ScalarFromText("3.0")), 3.0);
  EXPECT_TRUE(std::get<bool>(ScalarFromText("true")));
  EXPECT_FALSE(std::get<bool>(ScalarFromText("False")));
  EXPECT_EQ(std::get<std::string>(ScalarFromText("\"3\"")), "3");
  EXPECT_EQ(std::get<std::string>(ScalarFromText("relu")), "relu");
  EXPECT_EQ(std::get<std::string>(ScalarFromText("0x10")), "0x10");
  EXPECT_TRUE(std::isinf(std::get<double>(ScalarFromText("inf"))));

  EXPECT_EQ(std::get<int64_t>(*ScalarFromJson(*ParseJson("3"))), 3);
  EXPECT_EQ(std::get<double>(*ScalarFromJson(*ParseJson("3.0"))), 3.0);
  EXPECT_EQ(std::get<std::string>(*ScalarFromJson(*ParseJson("\"a\""))), "a");
  EXPECT_FALSE(ScalarFromJson(*ParseJson("[1]")).ok());
}

TEST(JsonTextTest, ParsesKeepingKeyOrderAndExactIntegers) {
  absl::StatusOr<Json> json = ParseJson(
      R"( {"b": [1, 2.5e3, -9007199254740993, 18446744073709551615], "a": {"x": null}} )");
  ASSERT_TRUE(json.ok()) << json.status();
  std::vector<std::string> keys;
  for (const auto& [key, value] : json->items()) keys.push_back(key);
  EXPECT_THAT(keys, ElementsAre("b", "a"));
  const Json& b = (*json)["b"];
  EXPECT_TRUE(b[0].is_number_integer());
  EXPECT_TRUE(b[1].is_number_float());
  EXPECT_EQ(b[2].get<int64_t>(), -9007199254740993);
  EXPECT_EQ(b[3].get<uint64_t>(), 18446744073709551615u);
  EXPECT_EQ(DumpJson(*json, false),
            R"({"b":[1,2500.0,-9007199254740993,18446744073709551615],"a":{"x":null}})");
  EXPECT_EQ(JsonMember(*json, "a"), &(*json)["a"]);
  EXPECT_EQ(JsonMember(*json, "c"), nullptr);
  EXPECT_EQ(JsonMember(b, "a"), nullptr);
}

TEST(JsonTextTest, SaysWhereTheTextIsWrong) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"\\x\"", "tru", "[1] 2",
                          "\"\\ud800\"", "1e400"}) {
    EXPECT_EQ(ParseJson(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(ParseJson(bad).status().message(), HasSubstr("invalid JSON")) << bad;
  }
  EXPECT_THAT(ParseJson("{\n  \"a\": x}").status().message(),
              HasSubstr("invalid JSON at line 2, column 8"));
  // nlohmann would keep the last "a" and read any depth: refused here.
  EXPECT_THAT(ParseJson(R"({"a": {"b": 1, "a": 2}, "a": 3})").status().message(),
              HasSubstr("the key \"a\" is given twice in one object"));
  EXPECT_TRUE(ParseJson(R"([{"a": 1}, {"a": 2}])").ok());
  EXPECT_TRUE(ParseJson(std::string(200, '[') + std::string(200, ']')).ok());
  EXPECT_THAT(ParseJson(std::string(201, '[') + std::string(201, ']')).status().message(),
              HasSubstr("nested more than 200 deep"));
}

TEST(JsonTextTest, Dumps) {
  Json json = Json::object();
  json["shape"] = {2, 3};
  json["s"] = "t\"\xc3\xa9\n";
  json["empty"] = Json::array();
  EXPECT_EQ(
      DumpJson(json),
      "{\n  \"shape\": [\n    2,\n    3\n  ],\n  \"s\": \"t\\\"\xc3\xa9\\n\",\n  \"empty\": []\n}");
  EXPECT_EQ(DumpJson(Json("a\xff")), "\"a\xef\xbf\xbd\"");  // not UTF-8: U+FFFD
  EXPECT_EQ(DumpJson(JsonDouble(std::numeric_limits<double>::infinity())), "\"Infinity\"");
  EXPECT_EQ(DumpJson(JsonDouble(std::nan(""))), "\"NaN\"");
  EXPECT_EQ(DumpJson(JsonDouble(0.1f, 9)), "0.100000001");
  EXPECT_EQ(DumpJson(JsonDouble(0.1f)), "0.10000000149011612");
  EXPECT_EQ(DumpJson(JsonDouble(2.0, 6)), "2.0");
}

}  // namespace
}  // namespace precompile::client
