// The model repository's decisions, as pure functions over plain snapshots
// of what is on disk and what is loaded: which models a rescan loads or
// retires, and which versions a load tries. ModelRepository
// (server/model_repository.h) gathers the snapshots and carries the
// decisions out; these functions touch no file, no lock and no model, so
// they are tested on their own.
#ifndef PRECOMPILE_SERVER_REPOSITORY_POLICY_H_
#define PRECOMPILE_SERVER_REPOSITORY_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace precompile::server {

// One model directory as a scan found it.
struct ModelOnDisk {
  // Version directories (positive integers), newest first.
  std::vector<int64_t> versions;
  // What the newest version's files look like (count, bytes, newest
  // modification time): a version read while still being copied in looks
  // different once the copy is done.
  std::string newest_fingerprint;
};

// What the repository holds for a model name.
struct ModelKnown {
  int64_t served_version = 0;  // 0: none served.
  // The newest version the last load tried, and its fingerprint then.
  int64_t attempted_version = 0;
  std::string attempted_fingerprint;
  // Unloaded on request: stays unloaded until loaded on request.
  bool unloaded_on_request = false;
};

enum class RescanAction {
  kKeep,    // Nothing to do.
  kLoad,    // Load (or reload) the model.
  kRetire,  // Stop serving: its directory is gone.
};

// What a rescan does with one model. `disk` is null when the scan did not
// find its directory, `known` when the repository never saw it.
//
// A model unloaded on request stays so; a model whose newest version and
// files are what the last load tried is left alone, so a version that
// failed is retried only once its files change; a directory without
// versions is ignored; a served model whose directory is gone is retired.
RescanAction DecideRescan(const ModelOnDisk* disk, const ModelKnown* known);

// The versions a load tries, in order, given the versions on disk (newest
// first) and the version served (0: none). The first that loads is served;
// if none does, the served version stays.
//
// While the served version is on disk a load never goes below it: it tries
// the newer versions, or, when none is newer, the served one itself (its
// files changed, or a reload was asked for); if that fails the loaded copy
// keeps serving. A served version whose directory was removed is a
// rollback: every version on disk is tried, newest first.
std::vector<int64_t> VersionsToTry(const std::vector<int64_t>& on_disk,
                                   int64_t served_version);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_POLICY_H_
