// ModelRepository carrying out its decisions (server/repository_policy.h)
// with an injected loader that records what it was asked to load and can
// fail a version on purpose, over a real repository directory.
#include "server/model_repository.h"

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

  absl::StatusOr<std::shared_ptr<LoadedVersion>> operator()(const std::string& directory,
                                                     const LoadOptions& options) {
    const std::string version = std::filesystem::path(directory).filename().string();
    {
      std::lock_guard<std::mutex> lock(mu);
      loaded.push_back(version);
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

TEST_F(RepositoryTest, AConfigAskingForAnotherVersionPolicyIsRefusedUntilItChanges) {
  WriteConfig(root_, "version_policy: { all: {} }\n");
  EXPECT_THAT(std::string(repository_->Load("mlp").status().message()),
              HasSubstr("config.pbtxt: version_policy { all { } } is not supported: the server "
                        "serves the newest version that loads"));
  EXPECT_THAT(loader_.loaded, ::testing::IsEmpty());
  EXPECT_EQ(Served(), nullptr);
  EXPECT_TRUE(repository_->List()[0].failed);

  repository_->Rescan();  // Unchanged: not tried again.
  EXPECT_TRUE(repository_->List()[0].failed);
  WriteConfig(root_, "version_policy: { latest: { num_versions: 1 } }\n");
  repository_->Rescan();  // Fixed: the rescan loads it.
  EXPECT_THAT(loader_.loaded, ElementsAre("1"));
  EXPECT_NE(Served(), nullptr);
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

}  // namespace
}  // namespace precompile::server
