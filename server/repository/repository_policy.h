// The model repository's decisions, as pure functions over plain snapshots
// of what is on disk and what is loaded: which models a rescan loads or
// retires, which versions a load tries, and what its results mean. ModelRepository
// (server/repository/model_repository.h) gathers the snapshots and carries the
// decisions out; these functions touch no file, no lock and no model, so
// they are tested on their own.
#ifndef PRECOMPILE_SERVER_REPOSITORY_REPOSITORY_POLICY_H_
#define PRECOMPILE_SERVER_REPOSITORY_REPOSITORY_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace precompile::server {

// Which versions of a model are served: Triton's ModelVersionPolicy, read
// from the model's config.pbtxt (default: the newest version that loads).
struct VersionPolicy {
  enum class Kind {
    kLatest,    // The `latest` newest versions that load.
    kSpecific,  // The versions listed in `specific`.
    kAll,       // Every version.
  };
  Kind kind = Kind::kLatest;
  int64_t latest = 1;
  std::vector<int64_t> specific;
};

// One version directory, and what its files look like (count, bytes,
// newest modification time): a version read while still being copied in
// looks different once the copy is done.
struct VersionOnDisk {
  int64_t version = 0;
  std::string fingerprint;
};

// One model directory as a scan found it.
struct ModelOnDisk {
  // Version directories (positive integers), newest first.
  std::vector<int64_t> versions;
  // What the versions' files and the model's config look like.
  std::string fingerprint;
};

// What the repository holds for a model name.
struct ModelKnown {
  bool served = false;  // Some version of it is served.
  // What the model looked like (ModelOnDisk::fingerprint) when last loaded.
  std::string attempted_fingerprint;
  // Unloaded on request: stays unloaded until loaded on request.
  bool unloaded_on_request = false;
  // Its last load failed and nothing of it is served.
  bool failed = false;
};

enum class RescanAction {
  kKeep,    // Nothing to do.
  kLoad,    // Load (or reload) the model.
  kRetire,  // Stop serving: its directory is gone.
  // Forget that its last load failed: what failed is gone from the disk.
  kForgetFailure,
};

// What a rescan does with one model. `disk` is null when the scan did not
// find its directory, `known` when the repository never saw it.
//
// A model unloaded on request stays so; a model whose files are what the
// last load saw is left alone, so a version that failed is retried only once
// the files change; a directory without versions is ignored; a served model
// whose directory is gone is retired. A failed load whose directory, or
// every version in it, is gone is forgotten: what failed is no longer in
// the repository (and, with strict readiness, no longer keeps the server
// from being ready).
RescanAction DecideRescan(const ModelOnDisk* disk, const ModelKnown* known);

// A version served now, and its files' fingerprint when it was loaded.
struct ServedVersion {
  int64_t version = 0;
  std::string fingerprint;
};

// What a load does: walk `steps` in order, counting a version as serving
// when it loads, or when it is kept (`load` false), or when its reload fails
// while an earlier copy of it is served (that copy keeps serving); stop once
// `wanted` versions serve. Versions served before and not counted are
// retired.
struct VersionPlan {
  struct Step {
    int64_t version = 0;
    bool load = true;  // false: the served copy is current; keep it.
  };
  std::vector<Step> steps;  // Newest first.
  size_t wanted = 0;
  // Versions the policy names that are not on disk.
  std::vector<int64_t> missing;
};

// The plan for one model. `on_disk` is newest first; `reload` (a load asked
// for by a user) reloads every served version it reaches, otherwise only
// those whose files changed.
//
// With `latest` N the walk goes down from the newest version until N serve,
// so a newer version that fails leaves the served one as it is, a served
// version is never replaced by an older one while it is on disk, and a
// served version whose directory was removed rolls back to the newest that
// remains. `specific` and `all` try each version they name that is on disk.
VersionPlan PlanVersions(const VersionPolicy& policy, const std::vector<VersionOnDisk>& on_disk,
                         const std::vector<ServedVersion>& served, bool reload);

// Why a version does not serve (or, for a refused config, why no version
// was tried): `message` is logged and reported for the version; `reason`,
// if not empty, is how the model's reason reads should this be the newest
// failure (else `message`).
struct LoadFailure {
  int64_t version = 0;
  std::string message;
  std::string reason;
};

// What became of one step of a plan.
struct StepResult {
  enum class Kind {
    kLoaded,  // It loaded.
    kKept,    // The served copy is current and stays.
    kFailed,  // It did not load: `failure` says why.
  };
  int64_t version = 0;
  Kind kind = Kind::kLoaded;
  LoadFailure failure;
};

// Walks `plan`'s steps in order, calling `load` for each step that loads
// (and none that keeps), until `plan.wanted` versions serve. A version
// serves when it loads or is kept, or when its reload fails while
// `served_before` holds an earlier copy of it (that copy keeps serving).
std::vector<StepResult> WalkPlan(const VersionPlan& plan,
                                 const std::vector<int64_t>& served_before,
                                 const std::function<StepResult(int64_t version)>& load);

// What a load's results mean.
struct LoadVerdict {
  enum class Kind {
    kServe,         // `serving` serve; `retired` stop serving.
    kKeepPrevious,  // Nothing serves anew: what was served stays as it was.
    kUnavailable,   // Nothing serves, and nothing did before.
  };
  Kind kind = Kind::kUnavailable;
  std::vector<int64_t> serving;  // Newest first.
  std::vector<int64_t> retired;  // Served before, not in `serving`.
  // Every failure, to log and report in this order: the steps', then the
  // versions the policy names that are not on disk.
  std::vector<LoadFailure> failures;
  // The model's reason: the first failure's, or empty.
  std::string reason;
};

// Resolves a walk of `plan` (`results`, from WalkPlan) against what was
// served before. `config_failure`, when set, is why the model's config was
// refused: nothing was planned, so what was served stays.
LoadVerdict ResolveLoad(const VersionPlan& plan, const std::vector<StepResult>& results,
                        const std::vector<int64_t>& served_before,
                        const std::optional<LoadFailure>& config_failure = std::nullopt);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_REPOSITORY_POLICY_H_
