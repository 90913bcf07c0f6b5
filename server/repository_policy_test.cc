// The repository's decisions without a repository: no files, no torch.
#include "server/repository_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace precompile::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

ModelOnDisk Disk(std::vector<int64_t> versions, std::string fingerprint = "1:3/100/7;|none") {
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

TEST(DecideRescan, LeavesAModelAloneWhileItsFilesAreWhatTheLastLoadSaw) {
  const ModelOnDisk disk = Disk({2, 1});
  const ModelKnown served{.served = true, .attempted_fingerprint = disk.fingerprint};
  EXPECT_EQ(DecideRescan(&disk, &served), RescanAction::kKeep);
  // The same for a model whose load failed: no retry until its files change.
  const ModelKnown failed{.served = false, .attempted_fingerprint = disk.fingerprint};
  EXPECT_EQ(DecideRescan(&disk, &failed), RescanAction::kKeep);
}

TEST(DecideRescan, LoadsOnceTheFilesChange) {
  // A new version, changed files or a changed config all change the fingerprint.
  const ModelOnDisk disk = Disk({2, 1}, "2:4/180/9;1:3/100/7;|none");
  const ModelKnown failed{.served = true, .attempted_fingerprint = "1:3/100/7;|none"};
  EXPECT_EQ(DecideRescan(&disk, &failed), RescanAction::kLoad);
}

TEST(DecideRescan, AModelUnloadedOnRequestStaysUnloadedWhateverIsOnDisk) {
  const ModelOnDisk disk = Disk({3, 2, 1}, "9/9/9");
  const ModelKnown unloaded{.served = false, .attempted_fingerprint = "3/100/7",
                            .unloaded_on_request = true};
  EXPECT_EQ(DecideRescan(&disk, &unloaded), RescanAction::kKeep);
}

TEST(DecideRescan, RetiresAServedModelWhoseDirectoryIsGoneAndNothingElse) {
  const ModelKnown served{.served = true};
  EXPECT_EQ(DecideRescan(nullptr, &served), RescanAction::kRetire);
  const ModelKnown failed{.served = false};
  EXPECT_EQ(DecideRescan(nullptr, &failed), RescanAction::kKeep);
  EXPECT_EQ(DecideRescan(nullptr, nullptr), RescanAction::kKeep);
}

// Versions on disk, newest first, each with the fingerprint "f<version>".
std::vector<VersionOnDisk> OnDisk(std::vector<int64_t> versions) {
  std::vector<VersionOnDisk> disk;
  for (int64_t v : versions) disk.push_back({v, absl::StrCat("f", v)});
  return disk;
}

ServedVersion Served(int64_t version) { return {version, absl::StrCat("f", version)}; }

// The plan as "3 2* 1" (* kept, not loaded) and how many it serves.
std::string Show(const VersionPlan& plan) {
  std::string out;
  for (const VersionPlan::Step& step : plan.steps) {
    absl::StrAppend(&out, out.empty() ? "" : " ", step.version, step.load ? "" : "*");
  }
  return absl::StrCat(out, " / ", plan.wanted);
}

VersionPolicy Latest(int64_t n) { return {VersionPolicy::Kind::kLatest, n, {}}; }

TEST(PlanVersions, TheDefaultServesTheNewestThatLoads) {
  // Nothing served: every version, newest first, until one loads.
  EXPECT_EQ(Show(PlanVersions(VersionPolicy{}, OnDisk({3, 2, 1}), {}, false)), "3 2 1 / 1");
  EXPECT_EQ(Show(PlanVersions(VersionPolicy{}, {}, {}, false)), " / 0");
}

TEST(PlanVersions, LatestNeverGoesBelowAServedVersionWhileItIsOnDisk) {
  // Versions 4 and 3 are tried; if both fail the walk reaches version 2,
  // which is kept as loaded, and version 1 is never tried.
  EXPECT_EQ(Show(PlanVersions(Latest(1), OnDisk({4, 3, 2, 1}), {Served(2)}, false)),
            "4 3 2* 1 / 1");
}

TEST(PlanVersions, AServedVersionIsReadAgainOnlyWhenItsFilesChangeOrAUserAsks) {
  EXPECT_EQ(Show(PlanVersions(Latest(1), OnDisk({2, 1}), {Served(2)}, false)), "2* 1 / 1");
  EXPECT_EQ(Show(PlanVersions(Latest(1), OnDisk({2, 1}), {{2, "before"}}, false)), "2 1 / 1");
  EXPECT_EQ(Show(PlanVersions(Latest(1), OnDisk({2, 1}), {Served(2)}, true)), "2 1 / 1");
}

TEST(PlanVersions, AServedVersionRemovedFromDiskIsARollbackToWhatRemains) {
  EXPECT_EQ(Show(PlanVersions(Latest(1), OnDisk({2, 1}), {Served(3)}, false)), "2 1 / 1");
}

TEST(PlanVersions, LatestNServesTheNNewest) {
  EXPECT_EQ(Show(PlanVersions(Latest(2), OnDisk({3, 2, 1}), {Served(2), Served(1)}, false)),
            "3 2* 1* / 2");
  // Fewer versions than asked for: all of them.
  EXPECT_EQ(Show(PlanVersions(Latest(3), OnDisk({2, 1}), {}, false)), "2 1 / 2");
}

TEST(PlanVersions, SpecificServesTheVersionsItNamesAndReportsThoseNotOnDisk) {
  const VersionPolicy specific{VersionPolicy::Kind::kSpecific, 1, {1, 3, 7}};
  const VersionPlan plan = PlanVersions(specific, OnDisk({4, 3, 2, 1}), {Served(3)}, false);
  EXPECT_EQ(Show(plan), "3* 1 / 2");
  EXPECT_THAT(plan.missing, ElementsAre(7));
}

TEST(PlanVersions, AllServesEveryVersion) {
  const VersionPolicy all{VersionPolicy::Kind::kAll, 1, {}};
  EXPECT_EQ(Show(PlanVersions(all, OnDisk({3, 2, 1}), {Served(1)}, false)), "3 2 1* / 3");
  EXPECT_THAT(PlanVersions(all, OnDisk({3}), {}, false).missing, IsEmpty());
}

}  // namespace
}  // namespace precompile::server
