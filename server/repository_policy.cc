#include "server/repository_policy.h"

#include <algorithm>

namespace precompile::server {

RescanAction DecideRescan(const ModelOnDisk* disk, const ModelKnown* known) {
  if (disk == nullptr) {
    return known != nullptr && known->served_version > 0 ? RescanAction::kRetire
                                                         : RescanAction::kKeep;
  }
  if (disk->versions.empty()) return RescanAction::kKeep;
  if (known == nullptr) return RescanAction::kLoad;
  if (known->unloaded_on_request) return RescanAction::kKeep;
  if (known->attempted_version == disk->versions.front() &&
      known->attempted_fingerprint == disk->newest_fingerprint) {
    return RescanAction::kKeep;
  }
  return RescanAction::kLoad;
}

std::vector<int64_t> VersionsToTry(const std::vector<int64_t>& on_disk,
                                   int64_t served_version) {
  const bool served_on_disk =
      served_version > 0 &&
      std::find(on_disk.begin(), on_disk.end(), served_version) != on_disk.end();
  if (!served_on_disk) return on_disk;
  // Reload the served version only when nothing newer is there.
  if (on_disk.front() == served_version) return {served_version};
  std::vector<int64_t> newer;
  for (int64_t version : on_disk) {
    if (version <= served_version) break;
    newer.push_back(version);
  }
  return newer;
}

}  // namespace precompile::server
