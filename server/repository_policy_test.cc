// The repository's decisions without a repository: no files, no torch.
#include "server/repository_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

ModelOnDisk Disk(std::vector<int64_t> versions, std::string fingerprint = "3/100/7") {
  return ModelOnDisk{std::move(versions), std::move(fingerprint)};
}

TEST(DecideRescan, LoadsAModelItHasNeverSeen) {
  const ModelOnDisk disk = Disk({1});
  EXPECT_EQ(DecideRescan(&disk, nullptr), RescanAction::kLoad);
}

TEST(DecideRescan, IgnoresADirectoryWithoutVersions) {
  const ModelOnDisk disk = Disk({}, "");
  EXPECT_EQ(DecideRescan(&disk, nullptr), RescanAction::kKeep);
}

TEST(DecideRescan, LeavesAModelAloneWhileItsNewestVersionIsWhatTheLastLoadTried) {
  const ModelOnDisk disk = Disk({2, 1});
  const ModelKnown served{.served_version = 2, .attempted_version = 2,
                          .attempted_fingerprint = "3/100/7"};
  EXPECT_EQ(DecideRescan(&disk, &served), RescanAction::kKeep);
  // The same for a version that failed: no retry until its files change.
  const ModelKnown failed{.served_version = 1, .attempted_version = 2,
                          .attempted_fingerprint = "3/100/7"};
  EXPECT_EQ(DecideRescan(&disk, &failed), RescanAction::kKeep);
}

TEST(DecideRescan, RetriesOnceTheNewestVersionsFilesChange) {
  const ModelOnDisk disk = Disk({2, 1}, "4/180/9");
  const ModelKnown failed{.served_version = 1, .attempted_version = 2,
                          .attempted_fingerprint = "3/100/7"};
  EXPECT_EQ(DecideRescan(&disk, &failed), RescanAction::kLoad);
}

TEST(DecideRescan, LoadsANewerVersion) {
  const ModelOnDisk disk = Disk({3, 2, 1});
  const ModelKnown served{.served_version = 2, .attempted_version = 2,
                          .attempted_fingerprint = "3/100/7"};
  EXPECT_EQ(DecideRescan(&disk, &served), RescanAction::kLoad);
}

TEST(DecideRescan, AModelUnloadedOnRequestStaysUnloadedWhateverIsOnDisk) {
  const ModelOnDisk disk = Disk({3, 2, 1}, "9/9/9");
  const ModelKnown unloaded{.served_version = 0, .attempted_version = 2,
                            .attempted_fingerprint = "3/100/7", .unloaded_on_request = true};
  EXPECT_EQ(DecideRescan(&disk, &unloaded), RescanAction::kKeep);
}

TEST(DecideRescan, RetiresAServedModelWhoseDirectoryIsGoneAndNothingElse) {
  const ModelKnown served{.served_version = 2, .attempted_version = 2};
  EXPECT_EQ(DecideRescan(nullptr, &served), RescanAction::kRetire);
  const ModelKnown failed{.served_version = 0, .attempted_version = 2};
  EXPECT_EQ(DecideRescan(nullptr, &failed), RescanAction::kKeep);
  EXPECT_EQ(DecideRescan(nullptr, nullptr), RescanAction::kKeep);
}

TEST(VersionsToTry, NothingServedTriesEveryVersionNewestFirst) {
  EXPECT_THAT(VersionsToTry({3, 2, 1}, 0), ElementsAre(3, 2, 1));
  EXPECT_THAT(VersionsToTry({}, 0), IsEmpty());
}

TEST(VersionsToTry, NeverGoesBelowTheServedVersionWhileItIsOnDisk) {
  // Only the newer ones: if they fail, the served one stays as loaded,
  // neither reloaded nor replaced by an older one.
  EXPECT_THAT(VersionsToTry({4, 3, 2, 1}, 2), ElementsAre(4, 3));
  // The served version is the newest (its files changed, or a reload was
  // asked for): only it.
  EXPECT_THAT(VersionsToTry({2, 1}, 2), ElementsAre(2));
}

TEST(VersionsToTry, AServedVersionRemovedFromDiskIsARollbackToWhatRemains) {
  EXPECT_THAT(VersionsToTry({2, 1}, 3), ElementsAre(2, 1));
}

}  // namespace
}  // namespace precompile::server
