#include "server/repository/model_config_file.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseModelConfig, AnEmptyConfigKeepsEveryDefault) {
  auto config = ParseModelConfig("mlp", "");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->policy.kind, VersionPolicy::Kind::kLatest);
  EXPECT_EQ(config->policy.latest, 1);
  EXPECT_EQ(config->max_request_time, std::nullopt);
  EXPECT_EQ(config->batching, nullptr);
}

TEST(ParseModelConfig, ReadsEachVersionPolicy) {
  auto latest = ParseModelConfig("mlp", "version_policy { latest { num_versions: 3 } }");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->policy.latest, 3);
  auto all = ParseModelConfig("mlp", "version_policy { all { } }");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->policy.kind, VersionPolicy::Kind::kAll);
  auto specific = ParseModelConfig("mlp", "version_policy { specific { versions: [3, 1] } }");
  ASSERT_TRUE(specific.ok()) << specific.status();
  EXPECT_EQ(specific->policy.kind, VersionPolicy::Kind::kSpecific);
  EXPECT_THAT(specific->policy.specific, ElementsAre(3, 1));
}

TEST(ParseModelConfig, RefusesWhatItCannotHonourNamingIt) {
  EXPECT_THAT(ParseModelConfig("mlp", "version_policy { latest { num_versions: 0 } }")
                  .status()
                  .message(),
              HasSubstr("num_versions } } must be at least 1"));
  EXPECT_THAT(ParseModelConfig("mlp", "version_policy { specific { versions: [0] } }")
                  .status()
                  .message(),
              HasSubstr("names version 0: versions are positive integers"));
  EXPECT_THAT(ParseModelConfig("mlp", "version_policy { specific { } }").status().message(),
              HasSubstr("names no version"));
  EXPECT_THAT(ParseModelConfig("mlp", "name: \"resnet\"").status().message(),
              HasSubstr("config.pbtxt names the model 'resnet', its directory 'mlp'"));
  // Line and column of the first error.
  EXPECT_THAT(ParseModelConfig("mlp", "name: \"mlp\"\nmax_batch_size: many").status().message(),
              HasSubstr("config.pbtxt:2:"));
  EXPECT_THAT(ParseModelConfig("mlp", "dynamic_batching { }").status().message(),
              HasSubstr("dynamic_batching needs max_batch_size above 0"));
  EXPECT_THAT(ParseModelConfig("mlp", "sequence_batching { }").status().message(),
              HasSubstr("config.pbtxt: sequence_batching names no state"));
}

TEST(ParseModelConfig, ReadsTheStateOfSequences) {
  EXPECT_EQ(ParseModelConfig("mlp", "")->sequences, nullptr);
  // As Triton users write it, with the strategy this server does not need.
  auto config = ParseModelConfig(
      "mlp", "sequence_batching { max_sequence_idle_microseconds: 2000000 direct { } "
             "state [ { input_name: \"past\" output_name: \"present\" "
             "data_type: TYPE_FP32 dims: [ -1 ] } ] }");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_NE(config->sequences, nullptr);
  EXPECT_EQ(config->sequences->max_idle, absl::Seconds(2));
  ASSERT_EQ(config->sequences->states.size(), 1u);
  EXPECT_EQ(config->sequences->states[0].input, "past");
  EXPECT_EQ(config->sequences->states[0].output, "present");
}

TEST(ParseModelConfig, IgnoresFieldsItDoesNotKnowAndReadsBatching) {
  auto config = ParseModelConfig(
      "mlp", "name: \"mlp\" platform: \"onnxruntime_onnx\" max_batch_size: 8 "
             "dynamic_batching { preferred_batch_size: [4] } "
             "some_future_field { value: 1 }");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_NE(config->batching, nullptr);
  EXPECT_EQ(config->batching->max_batch_size, 8);
  EXPECT_EQ(config->batching->full_rows, 4);
}

TEST(ParseModelConfig, ReadsTheModelsOwnRequestTimeLimit) {
  auto limit = [](const std::string& value) {
    return ParseModelConfig(
        "mlp", "parameters { key: \"max_request_seconds\" value { string_value: \"" + value +
                   "\" } }");
  };
  ASSERT_TRUE(limit("2.5").ok());
  EXPECT_EQ(limit("2.5")->max_request_time, absl::Milliseconds(2500));
  EXPECT_EQ(limit("0")->max_request_time, absl::InfiniteDuration());
  for (const char* bad : {"-1", "soon", "nan", "1e9"}) {
    EXPECT_THAT(limit(bad).status().message(),
                HasSubstr(std::string("max_request_seconds is '") + bad + "', not a number"))
        << bad;
  }
}

TEST(ParseModelConfig, CountsTheInstancesOfEveryGroup) {
  EXPECT_EQ(ParseModelConfig("mlp", "")->instances.count, 0) << "the server's default";
  auto groups = ParseModelConfig(
      "mlp", "instance_group [{ count: 3 kind: KIND_GPU }, { kind: KIND_AUTO }]");
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_EQ(groups->instances.count, 4) << "a group without a count has one, as in Triton";
  EXPECT_EQ(groups->instances.kind, InstanceGroups::Kind::kGpu);
  auto cpu = ParseModelConfig("mlp", "instance_group { count: 2 kind: KIND_CPU }");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(cpu->instances.count, 2);
  EXPECT_EQ(cpu->instances.kind, InstanceGroups::Kind::kCpu);
  EXPECT_EQ(ParseModelConfig("mlp", "instance_group { count: 2 }")->instances.kind,
            InstanceGroups::Kind::kAny);
}

TEST(ParseModelConfig, RefusesInstancesItCannotPlace) {
  auto refused = [](const std::string& text) {
    return std::string(ParseModelConfig("mlp", text).status().message());
  };
  EXPECT_THAT(refused("instance_group { name: \"a\" count: -1 }"),
              HasSubstr("instance_group 'a' has count -1: at least 1"));
  EXPECT_THAT(refused("instance_group { count: 1 kind: KIND_GPU gpus: [1] }"),
              HasSubstr("instance_group names gpus"));
  EXPECT_THAT(refused("instance_group [{ kind: KIND_GPU }, { kind: KIND_CPU }]"),
              HasSubstr("asks for KIND_CPU where another group asks for the other kind"));
  EXPECT_THAT(refused("instance_group [{ count: 40 }, { count: 25 }]"),
              HasSubstr("more than 64 instances"));
  EXPECT_TRUE(ParseModelConfig("mlp", "instance_group [{ count: 40 }, { count: 24 }]").ok());
  // Past 2^31 in all, not wrapped round.
  EXPECT_THAT(refused("instance_group [{ count: 40 }, { count: 2147483647 }]"),
              HasSubstr("more than 64 instances"));
}

TEST(ReadModelConfig, ReadsTheModelsFileOrKeepsTheDefaults) {
  const std::string dir = ::testing::TempDir() + "/model_config_file_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto none = ReadModelConfig("mlp", dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->batching, nullptr);
  std::ofstream(dir + "/config.pbtxt") << "max_batch_size: 4";
  auto read = ReadModelConfig("mlp", dir);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_NE(read->batching, nullptr);
  EXPECT_EQ(read->batching->max_batch_size, 4);
}

}  // namespace
}  // namespace precompile::server
