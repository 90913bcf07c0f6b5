#include "client/misses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace precompile::client {
namespace {

using ::testing::HasSubstr;

// What `precompile_client --json misses loop` prints, trimmed: two entry
// signatures and one of a callee.
constexpr char kMisses[] = R"({
  "name": "loop", "version": 1, "model_name": "loop", "torch_version": "2.11.0",
  "device": "cpu", "signatures_per_frame": 64,
  "frames": [
    {"frame": "forward", "eager_fallback": true, "is_entry": true, "other_calls": 0,
     "signatures": [
       {"call": {"arguments": [
          {"name": "x", "tensor": {"dtype": "DTYPE_FLOAT32", "device": "cpu", "shape": [3, 4]}},
          {"name": "n", "scalar": {"int_value": 2}},
          {"name": "mask", "scalar": {"none": true}}]},
        "count": 5, "outcome": "EAGER_FALLBACK", "closest_variant": "forward#0",
        "failing_guard": "n: expected 0, got 2"},
       {"call": {"arguments": [
          {"name": "x", "tensor": {"dtype": "DTYPE_INT64", "device": "cpu", "shape": [2]}},
          {"name": "n", "scalar": {"int_value": 0}},
          {"name": "mask", "scalar": {"bool_value": true}}]},
        "count": "1", "outcome": "REFUSED"}]},
    {"frame": "helper", "is_entry": false,
     "signatures": [{"call": {"arguments": [
        {"name": "y", "tensor": {"dtype": "DTYPE_FLOAT32", "device": "cpu", "shape": [1]}}]},
        "count": 9}]}]
})";

TEST(MissesTest, SignatureTextSaysWhatTheGuardsRead) {
  absl::StatusOr<precompile::v1::MissesResponse> misses = ParseMisses(kMisses);
  ASSERT_TRUE(misses.ok()) << misses.status();
  EXPECT_EQ(SignatureText(misses->frames(0).signatures(0).call()),
            "x: float32[3, 4], n: 2, mask: None");
  EXPECT_EQ(SignatureText(misses->frames(0).signatures(1).call()),
            "x: int64[2], n: 0, mask: True");
}

TEST(MissesTest, ReplaysEachEntrySignatureWeightedByItsCount) {
  absl::StatusOr<precompile::v1::MissesResponse> misses = ParseMisses(kMisses);
  ASSERT_TRUE(misses.ok()) << misses.status();
  absl::StatusOr<std::vector<RequestTemplate>> mix = MissesRequestMix(*misses, 1);
  ASSERT_TRUE(mix.ok()) << mix.status();
  ASSERT_EQ(mix->size(), 2u) << "the callee's misses are not requests";
  const RequestTemplate& first = (*mix)[0];
  EXPECT_EQ(first.name, "forward(x: float32[3, 4], n: 2, mask: None)");
  EXPECT_EQ(first.weight, 5);
  EXPECT_EQ(first.model, "loop");
  EXPECT_EQ(first.request->model_version(), "") << "the version serving now";
  ASSERT_EQ(first.request->inputs_size(), 1);
  EXPECT_EQ(first.request->inputs(0).datatype(), "FP32");
  EXPECT_THAT(first.request->inputs(0).shape(), ::testing::ElementsAre(3, 4));
  EXPECT_EQ(first.request->parameters().at("n").int64_param(), 2);
  EXPECT_FALSE(first.request->parameters().contains("mask")) << "None is left to the default";

  const RequestTemplate& second = (*mix)[1];
  EXPECT_EQ(second.request->inputs(0).datatype(), "INT64");
  EXPECT_EQ(second.request->raw_input_contents(0), std::string(16, '\0'))
      << "integer tensors are zeros: a valid index into any table";
  EXPECT_TRUE(second.request->parameters().at("mask").bool_param());
}

TEST(MissesTest, RefusesWhatIsNoMissesFileByName) {
  EXPECT_THAT(ParseMisses("[1, 2]").status().message(), HasSubstr("not a misses file"));
  EXPECT_THAT(ParseMisses(R"({"name": "m", "frames": [{"bogus": 1}]})").status().message(),
              HasSubstr("not a misses file"));
  EXPECT_THAT(ParseMisses(R"({"frames": []})").status().message(), HasSubstr("names no model"));

  absl::StatusOr<precompile::v1::MissesResponse> callee_only = ParseMisses(
      R"({"name": "loop", "frames": [{"frame": "helper", "signatures": [{"count": 1}]}]})");
  ASSERT_TRUE(callee_only.ok()) << callee_only.status();
  EXPECT_THAT(MissesRequestMix(*callee_only, 1).status().message(),
              HasSubstr("hold no call of its entry frame"));
}

}  // namespace
}  // namespace precompile::client
