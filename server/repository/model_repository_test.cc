// ModelRepository carrying out its decisions (server/repository/repository_policy.h)
// with an injected loader that records what it was asked to load and can
// fail a version on purpose, over a real repository directory.
#include "server/repository/model_repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/testing/artifacts.h"

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// LoadedVersion::Load, except for the directories in `broken`; records every call.
struct RecordingLoader {
  std::mutex mu;
  std::vector<std::string> loaded;  // Version directory names, in order.
  std::set<std::string> broken;
  int runners_per_variant = 0;  // The last load's.

  absl::StatusOr<std::shared_ptr<LoadedVersion>> operator()(const std::string& directory,
                                                     const LoadOptions& options) {
    const std::string version = std::filesystem::path(directory).filename().string();
    {
      std::lock_guard<std::mutex> lock(mu);
      loaded.push_back(version);
      runners_per_variant = options.runners_per_variant;
      if (broken.count(version)) {
        return absl::DataLossError(absl::StrCat("version ", version, " is broken"));
      }
    }
    return LoadedVersion::Load(directory, options);
  }
};

class RepositoryTest : public ::testing::Test {
 protected:
  RepositoryTest() : root_(testing::ExampleRepository({"mlp"})) {
    RepositoryOptions options;
    options.root = root_;
    options.loader = [this](const std::string& directory, const LoadOptions& load_options) {
      return loader_(directory, load_options);
    };
    repository_ = std::make_unique<ModelRepository>(std::move(options), nullptr);
  }

  void AddVersion(int version) {
    testing::CopyTree(testing::ExampleArtifact("mlp"),
                      root_ + "/mlp/" + std::to_string(version));
  }

  std::shared_ptr<LoadedVersion> Served() {
    auto handle = repository_->Get("mlp", "");
    return handle.ok() ? handle->model : nullptr;
  }

  const std::string root_;
  RecordingLoader loader_;
  std::unique_ptr<ModelRepository> repository_;
};

TEST_F(RepositoryTest, ANewerVersionThatFailsLeavesTheServedOneAsLoaded) {
  repository_->Rescan();
  const std::shared_ptr<LoadedVersion> first = Served();
  ASSERT_NE(first, nullptr);

  loader_.broken = {"2", "3"};
  AddVersion(2);
  AddVersion(3);
  repository_->Rescan();
  // Versions 3 and 2 were tried, version 1 neither reloaded nor replaced.
  EXPECT_THAT(loader_.loaded, ElementsAre("1", "3", "2"));
  EXPECT_EQ(Served(), first);
  const std::vector<ModelState> states = repository_->List();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].version, 1);
  EXPECT_THAT(states[0].reason, HasSubstr("version 3 failed to load: version 3 is broken"));

  // Unchanged files: a rescan does not try again.
  repository_->Rescan();
  EXPECT_EQ(loader_.loaded.size(), 3u);
}

TEST_F(RepositoryTest, AServedVersionWhoseFilesChangeAndNoLongerLoadKeepsServingItsLoadedCopy) {
  AddVersion(2);
  repository_->Rescan();
  const std::shared_ptr<LoadedVersion> loaded = Served();
  ASSERT_EQ(repository_->List()[0].version, 2);

  // Its files change (a copy in progress, say) and it no longer loads: the
  // copy in memory keeps serving, and version 1 is not tried.
  loader_.broken = {"2"};
  std::ofstream(root_ + "/mlp/2/partial") << "x";
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("2", "2"));
  EXPECT_EQ(Served(), loaded);
  EXPECT_EQ(repository_->List()[0].version, 2);
}

TEST_F(RepositoryTest, RemovingTheServedVersionRollsBackToTheNewestThatRemains) {
  AddVersion(2);
  repository_->Rescan();
  ASSERT_EQ(repository_->List()[0].version, 2);
  std::filesystem::remove_all(root_ + "/mlp/2");
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("2", "1"));
  EXPECT_EQ(repository_->List()[0].version, 1);
}

TEST_F(RepositoryTest, AModelUnloadedOnRequestStaysUnloadedUntilLoadedOnRequest) {
  repository_->Rescan();
  ASSERT_TRUE(repository_->Unload("mlp").ok());
  AddVersion(2);
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("1"));
  EXPECT_EQ(Served(), nullptr);
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_THAT(loader_.loaded, ElementsAre("1", "2"));
  EXPECT_EQ(repository_->List()[0].version, 2);
}

void WriteConfig(const std::string& root, const std::string& text) {
  std::ofstream(root + "/mlp/config.pbtxt") << text;
}

TEST_F(RepositoryTest, AConfigMayNameTheModelAndAskForTheNewestVersion) {
  // As Triton users write it, with fields this server ignores.
  WriteConfig(root_, R"(name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: 0
version_policy: { latest: { num_versions: 1 } }
model_warmup { name: "w" batch_size: 1 }
response_cache { enable: false }
)");
  AddVersion(2);
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("2"));
  EXPECT_EQ(repository_->List()[0].version, 2);
}

TEST_F(RepositoryTest, AConfigWithAPolicyThatCannotBeServedIsRefusedUntilItChanges) {
  WriteConfig(root_, "version_policy: { latest: { num_versions: 0 } }\n");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("config.pbtxt: version_policy { latest { num_versions } } must be at "
                        "least 1"));
  EXPECT_THAT(loader_.loaded, ::testing::IsEmpty());
  EXPECT_EQ(Served(), nullptr);
  EXPECT_TRUE(repository_->List()[0].failed);

  repository_->Rescan();  // Unchanged: not tried again.
  EXPECT_TRUE(repository_->List()[0].failed);
  WriteConfig(root_, "version_policy: { latest: { num_versions: 1 } }\n");
  repository_->Rescan();  // Fixed: the rescan loads it.
  EXPECT_THAT(loader_.loaded, ElementsAre("1"));
  EXPECT_NE(Served(), nullptr);

  WriteConfig(root_, "version_policy: { specific: { } }\n");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("version_policy { specific } names no version"));
  EXPECT_NE(Served(), nullptr);  // What was served stays.
}

// With strict readiness a failed model keeps the server from being ready:
// deleting it, or unloading it, must end that without a restart.
TEST_F(RepositoryTest, AFailedLoadIsForgottenOnceItsFilesAreGoneOrItIsUnloaded) {
  loader_.broken.insert("1");
  repository_->Rescan();
  ASSERT_TRUE(repository_->List()[0].failed);

  std::filesystem::remove_all(root_ + "/mlp/1");
  repository_->Rescan();
  ASSERT_EQ(repository_->List().size(), 1u);
  EXPECT_FALSE(repository_->List()[0].failed);
  EXPECT_EQ(repository_->List()[0].reason, "its directory holds no versions");

  AddVersion(1);
  repository_->Rescan();  // New files: tried again, and failed again.
  ASSERT_TRUE(repository_->List()[0].failed);
  std::filesystem::remove_all(root_ + "/mlp");
  repository_->Rescan();
  EXPECT_FALSE(repository_->List()[0].failed);
  EXPECT_EQ(repository_->List()[0].reason, "its directory was removed from the repository");
  EXPECT_EQ(repository_->Unload("mlp").status().code(), absl::StatusCode::kNotFound);

  testing::CopyTree(testing::ExampleArtifact("mlp"), root_ + "/mlp/1");
  repository_->Rescan();
  ASSERT_TRUE(repository_->List()[0].failed);
  absl::StatusOr<ModelState> unloaded = repository_->Unload("mlp");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  EXPECT_FALSE(repository_->List()[0].failed);
  EXPECT_EQ(repository_->List()[0].reason, "unloaded on request");
  loader_.broken.clear();
  repository_->Rescan();  // Unloaded on request: stays so.
  EXPECT_EQ(Served(), nullptr);
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_NE(Served(), nullptr);
}

// The versions Get serves, asked for one by one; "-" for none.
std::string ServedVersions(const ModelRepository& repository) {
  std::string out;
  for (const char* v : {"1", "2", "3", "4"}) {
    auto handle = repository.Get("mlp", v);
    if (handle.ok()) absl::StrAppend(&out, out.empty() ? "" : ",", handle->version);
  }
  return out.empty() ? "-" : out;
}

TEST_F(RepositoryTest, LatestTwoServesTheTwoNewestAndRequestsPickOneByNumber) {
  WriteConfig(root_, "version_policy: { latest: { num_versions: 2 } }\n");
  AddVersion(2);
  AddVersion(3);
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("3", "2"));
  EXPECT_EQ(ServedVersions(*repository_), "2,3");
  EXPECT_THAT(repository_->List()[0].versions, ElementsAre(3, 2));
  // No version asked for: the newest.
  EXPECT_EQ(repository_->Get("mlp", "")->version, 3);
  EXPECT_EQ(repository_->Get("mlp", "")->model, repository_->Get("mlp", "3")->model);
  EXPECT_NE(repository_->Get("mlp", "2")->model, repository_->Get("mlp", "3")->model);
  const absl::Status missing = repository_->Get("mlp", "1").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()),
              HasSubstr("version '1' of model 'mlp' is not served (serving versions 3, 2)"));
  auto all = repository_->GetVersions("mlp");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].version, 3);
  EXPECT_EQ((*all)[1].version, 2);

  // A fourth version: 4 and 3 serve, 3 is kept as loaded, 2 is retired.
  const std::shared_ptr<LoadedVersion> three = repository_->Get("mlp", "3")->model;
  AddVersion(4);
  repository_->Rescan();
  EXPECT_THAT(loader_.loaded, ElementsAre("3", "2", "4"));
  EXPECT_EQ(ServedVersions(*repository_), "3,4");
  EXPECT_EQ(repository_->Get("mlp", "3")->model, three);
}

TEST_F(RepositoryTest, SpecificAndAllServeTheVersionsTheyNameAndReportWhatIsMissing) {
  AddVersion(2);
  AddVersion(3);
  WriteConfig(root_, "version_policy: { specific: { versions: [1, 3, 7] } }\n");
  const absl::Status partly = repository_->Load("mlp").status();
  EXPECT_THAT(std::string(partly.message()),
              HasSubstr("version_policy names version 7, not in the repository; serving "
                        "versions 3, 1"));
  EXPECT_EQ(ServedVersions(*repository_), "1,3");
  EXPECT_FALSE(repository_->List()[0].failed);

  WriteConfig(root_, "version_policy: { all: { } }\n");
  repository_->Rescan();  // The config changed: 2 joins, 3 and 1 stay as loaded.
  EXPECT_THAT(loader_.loaded, ElementsAre("3", "1", "2"));
  EXPECT_EQ(ServedVersions(*repository_), "1,2,3");

  // A version that fails under `all` leaves the others serving.
  loader_.broken = {"4"};
  AddVersion(4);
  repository_->Rescan();
  EXPECT_EQ(ServedVersions(*repository_), "1,2,3");
  EXPECT_THAT(repository_->List()[0].reason, HasSubstr("version 4 failed to load"));
}

TEST_F(RepositoryTest, AConfigThatDoesNotParseOrNamesAnotherModelIsRefusedNamingWhy) {
  WriteConfig(root_, "version_policy: { latest: { num_versions: \"two\" } }\n");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("config.pbtxt:1:"));
  WriteConfig(root_, "name: \"resnet\"\n");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("config.pbtxt names the model 'resnet', its directory 'mlp'"));
  EXPECT_THAT(loader_.loaded, ::testing::IsEmpty());
}

TEST_F(RepositoryTest, ASequenceStateTheModelCannotKeepIsRefusedAtLoad) {
  // The mlp's only input, x, has no default: a sequence's first request,
  // which runs without its state, could not call it.
  WriteConfig(root_, R"(sequence_batching { state { input_name: "x" output_name: "output0" } })");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("cannot be served as its config.pbtxt asks: sequence_batching { state } "
                        "names input 'x', which a call may not leave out"));
  EXPECT_EQ(Served(), nullptr);
  WriteConfig(root_, R"(sequence_batching { state { input_name: "h" output_name: "output0" } })");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("names input 'h', which is not a tensor input of the model"));
  WriteConfig(root_, "");
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(repository_->Get("mlp", "")->sequences, nullptr);
}

TEST_F(RepositoryTest, AConfigsInstanceGroupsSetTheInstancesOfEachVariant) {
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(loader_.runners_per_variant, 2) << "the server's --runners_per_variant";
  WriteConfig(root_, "instance_group [{ count: 3 kind: KIND_CPU }, { count: 2 }]");
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(loader_.runners_per_variant, 5);
  EXPECT_EQ(Served()->runners_per_variant(), 5);
}

TEST_F(RepositoryTest, InstancesOfAnotherKindOfDeviceThanTheArtifactsAreRefusedAtLoad) {
  WriteConfig(root_, "instance_group { count: 2 kind: KIND_GPU }");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("cannot be served as its config.pbtxt asks: instance_group asks for "
                        "KIND_GPU instances, but the artifact was captured for the CPU"));
  EXPECT_EQ(Served(), nullptr);
}

TEST_F(RepositoryTest, AConfigMaySetTheModelsOwnRequestTimeLimit) {
  auto limit_served = [this] {
    auto handle = repository_->Get("mlp", "");
    EXPECT_TRUE(handle.ok()) << handle.status();
    return handle.ok() ? handle->max_request_time : std::nullopt;
  };
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(limit_served(), std::nullopt);  // The server's applies.
  // As Triton's parameters are written: a string value.
  WriteConfig(root_, R"(parameters { key: "max_request_seconds" value { string_value: "2.5" } })");
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(limit_served(), absl::Milliseconds(2500));
  EXPECT_EQ(repository_->GetVersions("mlp")->front().max_request_time, absl::Milliseconds(2500));
  WriteConfig(root_, R"(parameters { key: "max_request_seconds" value { string_value: "0" } })");
  ASSERT_TRUE(repository_->Load("mlp").ok());
  EXPECT_EQ(limit_served(), absl::InfiniteDuration());
  // Which values are refused: model_config_file_test.
  WriteConfig(root_, R"(parameters { key: "max_request_seconds" value { string_value: "soon" } })");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("max_request_seconds is 'soon', not a number"));
  // A refused config leaves what was served, with its limit.
  EXPECT_EQ(limit_served(), absl::InfiniteDuration());
}

}  // namespace
}  // namespace precompile::server
