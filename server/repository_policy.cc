#include "server/repository_policy.h"

#include <algorithm>

namespace precompile::server {

RescanAction DecideRescan(const ModelOnDisk* disk, const ModelKnown* known) {
  if (disk == nullptr) {
    return known != nullptr && known->served ? RescanAction::kRetire : RescanAction::kKeep;
  }
  if (disk->versions.empty()) return RescanAction::kKeep;
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

}  // namespace precompile::server
