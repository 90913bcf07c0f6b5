#include "server/repository/repository_policy.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace precompile::server {

RescanAction DecideRescan(const ModelOnDisk* disk, const ModelKnown* known) {
  const bool failed = known != nullptr && known->failed;
  if (disk == nullptr) {
    if (known != nullptr && known->served) return RescanAction::kRetire;
    return failed ? RescanAction::kForgetFailure : RescanAction::kKeep;
  }
  if (disk->versions.empty()) return failed ? RescanAction::kForgetFailure : RescanAction::kKeep;
  if (known == nullptr) return RescanAction::kLoad;
  if (known->unloaded_on_request) return RescanAction::kKeep;
  if (known->attempted_fingerprint == disk->fingerprint) return RescanAction::kKeep;
  return RescanAction::kLoad;
}

VersionPlan PlanVersions(const VersionPolicy& policy, const std::vector<VersionOnDisk>& on_disk,
                         const std::vector<ServedVersion>& served, bool reload) {
  VersionPlan plan;
  for (const VersionOnDisk& disk : on_disk) {
    if (policy.kind == VersionPolicy::Kind::kSpecific &&
        std::find(policy.specific.begin(), policy.specific.end(), disk.version) ==
            policy.specific.end()) {
      continue;
    }
    auto current = std::find_if(served.begin(), served.end(), [&](const ServedVersion& s) {
      return s.version == disk.version;
    });
    const bool keep = !reload && current != served.end() && current->fingerprint == disk.fingerprint;
    plan.steps.push_back({disk.version, !keep});
  }
  if (policy.kind == VersionPolicy::Kind::kSpecific) {
    for (const int64_t version : policy.specific) {
      if (std::none_of(on_disk.begin(), on_disk.end(),
                       [&](const VersionOnDisk& d) { return d.version == version; })) {
        plan.missing.push_back(version);
      }
    }
  }
  plan.wanted = policy.kind == VersionPolicy::Kind::kLatest
                    ? std::min(plan.steps.size(), static_cast<size_t>(std::max<int64_t>(policy.latest, 0)))
                    : plan.steps.size();
  return plan;
}

namespace {

bool Contains(const std::vector<int64_t>& versions, int64_t version) {
  return std::find(versions.begin(), versions.end(), version) != versions.end();
}

bool Serves(const StepResult& result, const std::vector<int64_t>& served_before) {
  return result.kind != StepResult::Kind::kFailed || Contains(served_before, result.version);
}

}  // namespace

std::vector<StepResult> WalkPlan(const VersionPlan& plan,
                                 const std::vector<int64_t>& served_before,
                                 const std::function<StepResult(int64_t version)>& load) {
  std::vector<StepResult> results;
  size_t serving = 0;
  for (const VersionPlan::Step& step : plan.steps) {
    if (serving >= plan.wanted) break;
    results.push_back(step.load ? load(step.version)
                                : StepResult{step.version, StepResult::Kind::kKept, {}});
    if (Serves(results.back(), served_before)) ++serving;
  }
  return results;
}

LoadVerdict ResolveLoad(const VersionPlan& plan, const std::vector<StepResult>& results,
                        const std::vector<int64_t>& served_before,
                        const std::optional<LoadFailure>& config_failure) {
  LoadVerdict verdict;
  if (config_failure) {
    verdict.failures.push_back(*config_failure);
  } else {
    for (const StepResult& result : results) {
      if (result.kind == StepResult::Kind::kFailed) verdict.failures.push_back(result.failure);
      if (Serves(result, served_before)) verdict.serving.push_back(result.version);
    }
    if (!plan.missing.empty()) {
      verdict.failures.push_back(
          {plan.missing.front(),
           absl::StrCat("version_policy names ", plan.missing.size() == 1 ? "version " : "versions ",
                        absl::StrJoin(plan.missing, ", "), ", not in the repository"),
           ""});
    }
  }
  if (!verdict.failures.empty()) {
    const LoadFailure& newest = verdict.failures.front();
    verdict.reason = newest.reason.empty() ? newest.message : newest.reason;
  }
  if (verdict.serving.empty()) {
    verdict.kind = served_before.empty() ? LoadVerdict::Kind::kUnavailable
                                         : LoadVerdict::Kind::kKeepPrevious;
    return verdict;
  }
  verdict.kind = LoadVerdict::Kind::kServe;
  std::sort(verdict.serving.begin(), verdict.serving.end(), std::greater<int64_t>());
  for (const int64_t version : served_before) {
    if (!Contains(verdict.serving, version)) verdict.retired.push_back(version);
  }
  return verdict;
}

}  // namespace precompile::server
