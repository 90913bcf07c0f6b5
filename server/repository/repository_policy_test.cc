// The repository's decisions without a repository: no files, no torch.
#include "server/repository/repository_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

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
  const ModelKnown unloaded{.served = false, .unloaded_on_request = true};
  EXPECT_EQ(DecideRescan(nullptr, &unloaded), RescanAction::kKeep);
  EXPECT_EQ(DecideRescan(nullptr, nullptr), RescanAction::kKeep);
}

// A load that failed kept the server from being ready (strict readiness)
// until it restarted, even once the broken model was deleted.
TEST(DecideRescan, ForgetsAFailedLoadWhoseFilesAreGone) {
  const ModelKnown failed{
      .served = false, .attempted_fingerprint = "1:3/100/7;|none", .failed = true};
  EXPECT_EQ(DecideRescan(nullptr, &failed), RescanAction::kForgetFailure);
  const ModelOnDisk no_versions = Disk({}, "");
  EXPECT_EQ(DecideRescan(&no_versions, &failed), RescanAction::kForgetFailure);
  // While the files that failed are there, the failure stands.
  const ModelOnDisk same = Disk({1}, failed.attempted_fingerprint);
  EXPECT_EQ(DecideRescan(&same, &failed), RescanAction::kKeep);
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

// A walk where the versions in `broken` fail to load and every other loads;
// returns the versions `load` was asked for.
std::vector<int64_t> Walk(const VersionPlan& plan, const std::vector<int64_t>& served_before,
                          const std::vector<int64_t>& broken, std::vector<StepResult>* results) {
  std::vector<int64_t> asked;
  *results = WalkPlan(plan, served_before, [&](int64_t version) {
    asked.push_back(version);
    if (std::find(broken.begin(), broken.end(), version) != broken.end()) {
      return StepResult{version, StepResult::Kind::kFailed,
                        {version, "broken", absl::StrCat("version ", version, " is broken")}};
    }
    return StepResult{version, StepResult::Kind::kLoaded, {}};
  });
  return asked;
}

TEST(WalkPlan, StopsOnceTheWantedVersionsServeAndNeverLoadsAKeptOne) {
  const VersionPlan plan = PlanVersions(Latest(1), OnDisk({4, 3, 2, 1}), {Served(2)}, false);
  std::vector<StepResult> results;
  // 4 fails, 3 loads: 2 is not reached.
  EXPECT_THAT(Walk(plan, {2}, {4}, &results), ElementsAre(4, 3));
  EXPECT_EQ(results.size(), 2u);
  // 4 and 3 fail: 2 is kept without loading, and 1 is never tried.
  EXPECT_THAT(Walk(plan, {2}, {4, 3}, &results), ElementsAre(4, 3));
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[2].kind, StepResult::Kind::kKept);
}

TEST(WalkPlan, AFailedReloadOfAServedVersionCountsAsServing) {
  // A user's reload of the served version 2 fails: its copy serves, so the
  // walk does not fall back to version 1.
  const VersionPlan plan = PlanVersions(Latest(1), OnDisk({2, 1}), {Served(2)}, true);
  std::vector<StepResult> results;
  EXPECT_THAT(Walk(plan, {2}, {2}, &results), ElementsAre(2));
  // Not served before: the walk goes on to version 1.
  EXPECT_THAT(Walk(plan, {}, {2}, &results), ElementsAre(2, 1));
}

TEST(ResolveLoad, ServesWhatLoadedNewestFirstAndRetiresTheRest) {
  const VersionPlan plan = PlanVersions(Latest(2), OnDisk({4, 3, 2, 1}), {Served(2)}, false);
  std::vector<StepResult> results;
  Walk(plan, {2, 1}, {}, &results);
  const LoadVerdict verdict = ResolveLoad(plan, results, {2, 1});
  EXPECT_EQ(verdict.kind, LoadVerdict::Kind::kServe);
  EXPECT_THAT(verdict.serving, ElementsAre(4, 3));
  EXPECT_THAT(verdict.retired, ElementsAre(2, 1));
  EXPECT_THAT(verdict.failures, IsEmpty());
  EXPECT_EQ(verdict.reason, "");
}

TEST(ResolveLoad, TheNewestFailureIsTheReasonAndAFailedReloadKeepsItsCopy) {
  const VersionPlan plan = PlanVersions(Latest(2), OnDisk({3, 2, 1}), {Served(2)}, true);
  std::vector<StepResult> results;
  Walk(plan, {2}, {3, 2}, &results);
  const LoadVerdict verdict = ResolveLoad(plan, results, {2});
  EXPECT_EQ(verdict.kind, LoadVerdict::Kind::kServe);
  EXPECT_THAT(verdict.serving, ElementsAre(2, 1));
  EXPECT_THAT(verdict.retired, IsEmpty());
  ASSERT_EQ(verdict.failures.size(), 2u);
  EXPECT_EQ(verdict.failures[0].version, 3);
  EXPECT_EQ(verdict.failures[1].version, 2);
  EXPECT_EQ(verdict.reason, "version 3 is broken");
}

TEST(ResolveLoad, NothingNewServingKeepsWhatServedOrLeavesTheModelUnavailable) {
  const VersionPlan plan = PlanVersions(Latest(1), OnDisk({3}), {}, false);
  std::vector<StepResult> results;
  Walk(plan, {}, {3}, &results);
  // Version 2 was served and its directory is gone: it stays served.
  EXPECT_EQ(ResolveLoad(plan, results, {2}).kind, LoadVerdict::Kind::kKeepPrevious);
  const LoadVerdict nothing = ResolveLoad(plan, results, {});
  EXPECT_EQ(nothing.kind, LoadVerdict::Kind::kUnavailable);
  EXPECT_EQ(nothing.reason, "version 3 is broken");
  EXPECT_THAT(nothing.serving, IsEmpty());
}

TEST(ResolveLoad, VersionsThePolicyNamesButTheDiskLacksAreReportedAfterTheSteps) {
  const VersionPolicy specific{VersionPolicy::Kind::kSpecific, 1, {1, 7, 9}};
  const VersionPlan plan = PlanVersions(specific, OnDisk({2, 1}), {}, false);
  std::vector<StepResult> results;
  Walk(plan, {}, {}, &results);
  const LoadVerdict verdict = ResolveLoad(plan, results, {});
  EXPECT_EQ(verdict.kind, LoadVerdict::Kind::kServe);
  EXPECT_THAT(verdict.serving, ElementsAre(1));
  ASSERT_EQ(verdict.failures.size(), 1u);
  EXPECT_EQ(verdict.failures[0].version, 7);
  EXPECT_EQ(verdict.reason, verdict.failures[0].message);
  EXPECT_EQ(verdict.reason, "version_policy names versions 7, 9, not in the repository");
}

TEST(ResolveLoad, ARefusedConfigServesNothingNewAndKeepsWhatServed) {
  const VersionPlan plan = PlanVersions(Latest(1), OnDisk({2, 1}), {Served(1)}, false);
  std::vector<StepResult> results;
  Walk(plan, {1}, {}, &results);
  const LoadFailure refused{2, "config.pbtxt: max_batch_size must be positive", ""};
  const LoadVerdict verdict = ResolveLoad(plan, results, {1}, refused);
  EXPECT_EQ(verdict.kind, LoadVerdict::Kind::kKeepPrevious);
  EXPECT_THAT(verdict.serving, IsEmpty());
  EXPECT_EQ(verdict.reason, refused.message);
  EXPECT_EQ(ResolveLoad(plan, results, {}, refused).kind, LoadVerdict::Kind::kUnavailable);
}

}  // namespace
}  // namespace precompile::server
