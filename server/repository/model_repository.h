// The models the server serves, from a repository directory laid out as
// <root>/<model>/<version>/ (each version directory a precompile artifact;
// versions are positive integers) with an optional <root>/<model>/config.pbtxt
// whose version_policy says which versions are served (default: the newest
// that loads). What to load, keep or retire is decided by
// server/repository/repository_policy.h; this class gathers what is on disk and loaded,
// and carries the decisions out.
//
// A request takes a Handle: a reference to the version it uses. Replacing a
// version loads the new one first and then swaps it in; requests holding the
// old one finish on it, and its memory goes when the last handle does. So a
// rollout or an unload never fails a request already running.
//
// Thread safety: all methods may be called concurrently. Loads are
// serialized (the AOTInductor loader is not thread-safe) and run outside the
// repository's lock, so serving continues while a model loads. Get() takes
// no lock while the repository is unchanged: each thread keeps the answers
// it last read and reads them again only after a change.
#ifndef PRECOMPILE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
#define PRECOMPILE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/loaded_version.h"
#include "server/repository/model_recorder.h"
#include "server/repository/model_state.h"
#include "server/repository/repository_policy.h"
#include "server/scheduling/dynamic_batching.h"
#include "server/scheduling/sequence_state.h"

namespace precompile::server {

// Told about every change, from the thread that made it.
class RepositoryListener {
 public:
  virtual ~RepositoryListener() = default;
  virtual void OnModelState(const ModelState& state) = 0;
  // A version of `name` failed to load (another may still be served).
  virtual void OnLoadFailure(const std::string& name, int64_t version,
                             const std::string& reason) = 0;
};

struct RepositoryOptions {
  std::string root;
  // Options for every model; the name is set per model.
  LoadOptions load_options;
  // Called once per loaded version before it serves: what records its calls
  // and requests (also set as its observer). May be empty.
  std::function<std::shared_ptr<ModelRecorder>(const std::string& name,
                                              int64_t version, const LoadedVersion&)>
      metrics_factory;
  // Loads one version directory; empty: LoadedVersion::Load.
  std::function<absl::StatusOr<std::shared_ptr<LoadedVersion>>(const std::string& directory,
                                                       const LoadOptions& options)>
      loader;
};

class ModelRepository {
 public:
  struct Handle {
    std::shared_ptr<LoadedVersion> model;
    int64_t version = 0;
    std::shared_ptr<ModelRecorder> metrics;  // May be null.
    // The model's limit on a request's time, if its config.pbtxt sets one
    // (filled in by Get and GetVersions).
    std::optional<absl::Duration> max_request_time;
    // The model's batching, if its config.pbtxt asks for it (filled in by
    // Get and GetVersions; server/scheduling/dynamic_batching.h).
    std::shared_ptr<const BatchingConfig> batching;
    // The state its sequences keep, if its config.pbtxt asks for it
    // (likewise; server/scheduling/sequence_state.h).
    std::shared_ptr<const SequenceConfig> sequences;
  };

  // `listener` may be null; it must outlive the repository.
  ModelRepository(RepositoryOptions options, RepositoryListener* listener);

  // Loads models found under the root that are not served yet, and the
  // versions of served ones that their policy now asks for; unloads models
  // whose directory is gone, and forgets failed loads whose files are gone
  // (DecideRescan). A model unloaded on request
  // stays unloaded, and a version that failed to load is retried only when
  // the model's files change. Returns every model's state afterwards.
  std::vector<ModelState> Rescan();

  // (Re)loads `name`: the versions its policy asks for (PlanVersions), each
  // served version read again. A version that fails leaves its served copy,
  // if any, serving.
  // NOT_FOUND: no such model directory; INVALID_ARGUMENT: a name that is not
  // a plain directory name; otherwise the load error of the newest version
  // that failed (other versions may still have loaded and be served).
  absl::StatusOr<ModelState> Load(const std::string& name);

  // Stops serving every version of `name`; running requests finish. A model
  // whose load failed is marked unloaded instead. NOT_FOUND for any other.
  absl::StatusOr<ModelState> Unload(const std::string& name);

  // The given `version` of `name`, or its newest served version for "".
  // NOT_FOUND for an unknown model or a version not served; UNAVAILABLE for
  // a model that is loading or failed to load.
  absl::StatusOr<Handle> Get(absl::string_view name,
                             absl::string_view version) const;

  // Every served version of `name`, newest first; errors as Get's.
  absl::StatusOr<std::vector<Handle>> GetVersions(absl::string_view name) const;

  std::vector<ModelState> List() const;

  // Every version served right now, with its model's state.
  std::vector<std::pair<ModelState, Handle>> Served() const;

  const std::string& root() const { return options_.root; }

 private:
  // One version served.
  struct Loaded {
    Handle handle;
    std::string directory;
    std::string fingerprint;  // Of its files when loaded.
  };
  struct Entry {
    ModelState state;
    std::vector<Loaded> versions;  // Newest first.
    // What the model's files looked like when a load last read them, so
    // that a rescan retries a version that failed only once they change
    // (it may have been read while still being copied in).
    std::string attempted_fingerprint;
    // Unloaded on request: stays unloaded until loaded on request.
    bool unloaded = false;
  };

  // What the decisions need to know of an entry.
  static ModelKnown Known(const Entry& entry);

  // What Get says about a model name, as of one change to the repository.
  // Weak references, so that a thread's copy keeps no model alive.
  struct Answer {
    absl::Status unavailable;  // OK when a version is served.
    std::optional<absl::Duration> max_request_time;
    std::shared_ptr<const BatchingConfig> batching;
    std::shared_ptr<const SequenceConfig> sequences;
    struct Version {
      std::weak_ptr<LoadedVersion> model;
      int64_t version = 0;
      std::weak_ptr<ModelRecorder> metrics;
    };
    std::vector<Version> versions;  // Newest first.
  };
  using Answers = absl::flat_hash_map<std::string, Answer>;
  struct ThreadAnswers;
  // Get's answer from `answers`; nullopt if the version it names is gone.
  static std::optional<absl::StatusOr<Handle>> Find(const Answers& answers,
                                                    absl::string_view name,
                                                    absl::string_view version);
  // After every change to models_: new answers for Get.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // `reload`: read every served version again (a load asked for by a user),
  // not only those whose files changed (a rescan).
  absl::StatusOr<ModelState> LoadLocked(const std::string& name, bool reload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  // Logs and reports the verdict's failures, then publishes what it says:
  // `state` (the load's, with its config) serving `loaded` versions and the
  // served copies in `previous_versions`, or `previous` kept, or nothing.
  absl::StatusOr<ModelState> CarryOut(const LoadVerdict& verdict, ModelState state,
                                      ModelState previous, std::vector<Loaded> previous_versions,
                                      absl::flat_hash_map<int64_t, Loaded> loaded);
  // Loads one version of `name` into `loaded` and gives it its recorder;
  // `config`: what the model's config.pbtxt asks for (batching, sequences'
  // state), which the entry frame must allow.
  StepResult LoadVersion(const std::string& name, int64_t version, const std::string& directory,
                         const std::string& fingerprint, const ModelState& config, bool reloaded,
                         absl::flat_hash_map<int64_t, Loaded>& loaded);
  // Replaces what the repository holds for `state.name` with `state` and
  // `versions` (empty: nothing served).
  void Publish(const ModelState& state, std::vector<Loaded> versions);
  // Stops serving `name`, with `reason`; returns what it served.
  std::optional<ModelState> Retire(const std::string& name, const std::string& reason,
                                   bool on_request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  // Marks `name`, whose last load failed and which serves nothing,
  // unavailable for `reason` instead (DecideRescan's kForgetFailure), and
  // returns its state; nullopt, changing nothing, for any other model.
  std::optional<ModelState> ForgetFailure(const std::string& name, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);

  const RepositoryOptions options_;
  RepositoryListener* const listener_;
  // std::mutex, not absl::Mutex: see base/notification.h.
  std::mutex load_mu_;  // Held while a load, unload or rescan runs.
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, Entry> models_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const Answers> answers_ ABSL_GUARDED_BY(mu_);
  // Counts changes; a thread's answers are current while it is unchanged.
  std::atomic<uint64_t> generation_{0};
  // Tells repositories apart in the threads' copies of their answers.
  const uint64_t id_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_REPOSITORY_MODEL_REPOSITORY_H_
