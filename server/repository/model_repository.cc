#include "server/repository/model_repository.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "server/repository/model_config_file.h"
#include "server/repository/repository_policy.h"

namespace precompile::server {
namespace {

// A name a client sent, for a message: a request may carry one of any
// length, and quoting it whole makes the answer as large.
std::string QuotedByClient(absl::string_view name) { return LoggedText(name, 256); }

namespace fs = std::filesystem;

bool IsPlainName(absl::string_view name) {
  return !name.empty() && name.front() != '.' &&
         name.find('/') == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos;
}

// Version directories of a model, newest first.
std::vector<std::pair<int64_t, std::string>> Versions(const fs::path& model_dir) {
  std::vector<std::pair<int64_t, std::string>> versions;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
    int64_t version = 0;
    if (entry.is_directory(ec) &&
        absl::SimpleAtoi(entry.path().filename().string(), &version) &&
        version > 0) {
      versions.emplace_back(version, entry.path().string());
    }
  }
  std::sort(versions.begin(), versions.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  return versions;
}

// What a version directory looks like: its files' count, total size and
// newest modification time.
std::string Fingerprint(const std::string& directory) {
  std::error_code ec;
  uint64_t files = 0, bytes = 0;
  fs::file_time_type newest{};
  for (const auto& entry : fs::recursive_directory_iterator(directory, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    ++files;
    bytes += entry.file_size(ec);
    newest = std::max(newest, entry.last_write_time(ec));
  }
  return absl::StrCat(files, "/", bytes, "/", newest.time_since_epoch().count());
}

// What a model looks like to a rescan: each version's files and its
// config.pbtxt (size and modification time, or none), so that fixing either
// retries a failed load.
std::string ModelFingerprint(const fs::path& model_dir, const std::vector<VersionOnDisk>& versions) {
  std::string fingerprint;
  for (const VersionOnDisk& v : versions) absl::StrAppend(&fingerprint, v.version, ":", v.fingerprint, ";");
  std::error_code ec;
  const fs::path config = model_dir / "config.pbtxt";
  std::string config_part = "none";
  if (fs::is_regular_file(config, ec)) {
    config_part = absl::StrCat(fs::file_size(config, ec), "/",
                               fs::last_write_time(config, ec).time_since_epoch().count());
  }
  return absl::StrCat(fingerprint, "|", config_part);
}

std::vector<VersionOnDisk> FingerprintVersions(
    const std::vector<std::pair<int64_t, std::string>>& versions) {
  std::vector<VersionOnDisk> on_disk;
  for (const auto& [version, directory] : versions) {
    on_disk.push_back({version, Fingerprint(directory)});
  }
  return on_disk;
}

std::string VersionList(const std::vector<int64_t>& versions) {
  return absl::StrCat(versions.size() == 1 ? "version " : "versions ",
                      absl::StrJoin(versions, ", "));
}

std::atomic<uint64_t> next_repository_id{1};

// Instances run where the artifact's variants were compiled for.
absl::Status CheckInstanceKind(const std::string& device, const InstanceGroups& instances) {
  const bool cuda = device == "cuda";
  if (instances.kind == InstanceGroups::Kind::kGpu && !cuda) {
    return absl::FailedPreconditionError(
        "instance_group asks for KIND_GPU instances, but the artifact was captured for the "
        "CPU; capture it on CUDA or ask for KIND_CPU");
  }
  if (instances.kind == InstanceGroups::Kind::kCpu && cuda) {
    return absl::FailedPreconditionError(
        "instance_group asks for KIND_CPU instances, but the artifact was captured for CUDA; "
        "capture it on the CPU or ask for KIND_GPU");
  }
  return absl::OkStatus();
}

// `state`, serving nothing, for `reason`.
ModelState Unavailable(ModelState state, const std::string& reason) {
  state.phase = ModelState::Phase::kUnavailable;
  state.failed = false;
  state.reason = reason;
  state.version = 0;
  state.versions.clear();
  state.directory.clear();
  return state;
}

}  // namespace

ModelKnown ModelRepository::Known(const Entry& entry) {
  ModelKnown known;
  known.served = !entry.versions.empty();
  known.attempted_fingerprint = entry.attempted_fingerprint;
  known.unloaded_on_request = entry.unloaded;
  known.failed = entry.state.failed;
  return known;
}

// A thread's copy of one repository's answers.
struct ModelRepository::ThreadAnswers {
  uint64_t repository = 0;
  uint64_t generation = 0;
  std::shared_ptr<const Answers> answers;
};

ModelRepository::ModelRepository(RepositoryOptions options,
                                 RepositoryListener* listener)
    : options_(std::move(options)),
      listener_(listener),
      answers_(std::make_shared<const Answers>()),
      id_(next_repository_id.fetch_add(1)) {}

void ModelRepository::Changed() {
  auto answers = std::make_shared<Answers>();
  for (const auto& [name, entry] : models_) {
    Answer& answer = (*answers)[name];
    answer.max_request_time = entry.state.max_request_time;
    answer.batching = entry.state.batching;
    answer.sequences = entry.state.sequences;
    if (!entry.versions.empty()) {
      for (const Loaded& loaded : entry.versions) {
        answer.versions.push_back(
            {loaded.handle.model, loaded.handle.version, loaded.handle.metrics});
      }
    } else if (entry.state.phase == ModelState::Phase::kLoading) {
      answer.unavailable = absl::UnavailableError(absl::StrCat("model '", name, "' is loading"));
    } else if (entry.unloaded) {
      answer.unavailable = absl::NotFoundError(absl::StrCat("model '", name, "' is unloaded"));
    } else {
      answer.unavailable = absl::UnavailableError(
          absl::StrCat("model '", name, "' is not available: ", entry.state.reason));
    }
  }
  answers_ = std::move(answers);
  generation_.fetch_add(1, std::memory_order_release);
}

void ModelRepository::Publish(const ModelState& state, std::vector<Loaded> versions) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = models_[state.name];
    entry.state = state;
    entry.versions = std::move(versions);
    Changed();
  }
  if (listener_) listener_->OnModelState(state);
}

std::optional<ModelState> ModelRepository::Retire(const std::string& name,
                                                  const std::string& reason,
                                                  bool on_request) {
  std::vector<Loaded> versions;
  ModelState state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end() || it->second.versions.empty()) return std::nullopt;
    versions = std::move(it->second.versions);
    it->second.versions.clear();
    state = it->second.state;
    it->second.unloaded = on_request;
    Changed();
  }
  Publish(Unavailable(state, reason), {});
  for (const Loaded& loaded : versions) {
    spdlog::info("event=model_unloaded model={} version={} calls_in_flight={} reason=\"{}\"",
                 name, loaded.handle.version, loaded.handle.model->calls_in_flight(), reason);
  }
  return state;
}

std::optional<ModelState> ModelRepository::ForgetFailure(const std::string& name,
                                                         const std::string& reason) {
  ModelState state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end() || !it->second.state.failed || !it->second.versions.empty()) {
      return std::nullopt;
    }
    state = it->second.state;
    // Whatever appears in its place next is loaded, the same files included.
    it->second.attempted_fingerprint.clear();
  }
  spdlog::info("event=model_failure_forgotten model={} reason=\"{}\"", name, reason);
  state = Unavailable(state, reason);
  Publish(state, {});
  return state;
}

absl::StatusOr<ModelState> ModelRepository::LoadLocked(const std::string& name, bool reload) {
  if (!IsPlainName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", name, "' is not a model name (a directory directly under the repository)"));
  }
  const fs::path model_dir = fs::path(options_.root) / name;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not in the repository ",
                                            options_.root));
  }
  ModelState previous;
  std::vector<Loaded> previous_versions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = models_.find(name); it != models_.end()) {
      previous = it->second.state;
      previous_versions = it->second.versions;
    }
  }
  ModelState state;
  state.name = name;
  if (previous_versions.empty()) {
    state.phase = ModelState::Phase::kLoading;
    Publish(state, {});
  }

  const auto versions = Versions(model_dir);
  if (versions.empty()) {
    const std::string reason =
        "no version directory (a positive integer) holds an artifact";
    if (previous_versions.empty()) {
      state.phase = ModelState::Phase::kUnavailable;
      state.reason = reason;
      state.failed = true;
      Publish(state, {});
    }
    spdlog::warn("event=model_load_failed model={} reason=\"{}\"", name, reason);
    return absl::FailedPreconditionError(absl::StrCat("model '", name, "': ", reason));
  }
  const std::vector<VersionOnDisk> on_disk = FingerprintVersions(versions);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = models_[name];
    entry.attempted_fingerprint = ModelFingerprint(model_dir, on_disk);
    entry.unloaded = false;
    Changed();
  }
  absl::flat_hash_map<int64_t, std::string> directories;
  absl::flat_hash_map<int64_t, std::string> fingerprints;
  for (size_t i = 0; i < versions.size(); ++i) {
    directories.emplace(versions[i].first, versions[i].second);  // "01" and "1": the first listed.
    fingerprints.emplace(on_disk[i].version, on_disk[i].fingerprint);
  }
  std::vector<int64_t> served_before;
  std::vector<ServedVersion> served;
  for (const Loaded& loaded : previous_versions) {
    served_before.push_back(loaded.handle.version);
    served.push_back({loaded.handle.version, loaded.fingerprint});
  }

  // A config the server refuses leaves nothing to try: what is served stays.
  absl::StatusOr<ModelConfigFile> config = ReadModelConfig(name, model_dir.string());
  VersionPlan plan;
  std::optional<LoadFailure> config_failure;
  if (config.ok()) {
    plan = PlanVersions(config->policy, on_disk, served, reload);
    state.policy = config->policy;
    state.max_request_time = config->max_request_time;
    state.batching = config->batching;
    state.sequences = config->sequences;
    state.instances = config->instances;
  } else {
    config_failure = LoadFailure{versions.front().first, std::string(config.status().message()), ""};
  }
  absl::flat_hash_map<int64_t, Loaded> loaded;
  const std::vector<StepResult> results = WalkPlan(plan, served_before, [&](int64_t version) {
    return LoadVersion(name, version, directories.at(version), fingerprints.at(version),
                       state, absl::c_linear_search(served_before, version),
                       loaded);
  });
  const LoadVerdict verdict = ResolveLoad(plan, results, served_before, config_failure);
  return CarryOut(verdict, std::move(state), std::move(previous), std::move(previous_versions),
                  std::move(loaded));
}

absl::StatusOr<ModelState> ModelRepository::CarryOut(
    const LoadVerdict& verdict, ModelState state, ModelState previous,
    std::vector<Loaded> previous_versions, absl::flat_hash_map<int64_t, Loaded> loaded) {
  const std::string& name = state.name;
  for (const LoadFailure& failure : verdict.failures) {
    spdlog::error("event=model_load_failed model={} version={} reason=\"{}\"", name,
                  failure.version, failure.message);
    if (listener_) listener_->OnLoadFailure(name, failure.version, failure.message);
  }
  const absl::Status failed =
      absl::FailedPreconditionError(absl::StrCat("model '", name, "': ", verdict.reason));
  switch (verdict.kind) {
    case LoadVerdict::Kind::kKeepPrevious:
      previous.reason = verdict.reason;
      Publish(previous, std::move(previous_versions));
      return failed;
    case LoadVerdict::Kind::kUnavailable:
      state.phase = ModelState::Phase::kUnavailable;
      state.reason = verdict.reason;
      state.failed = true;
      Publish(state, {});
      return failed;
    case LoadVerdict::Kind::kServe: break;
  }
  std::vector<Loaded> serving;
  for (const int64_t version : verdict.serving) {
    if (auto it = loaded.find(version); it != loaded.end()) {
      serving.push_back(std::move(it->second));
    } else {
      serving.push_back(*absl::c_find_if(previous_versions, [&](const Loaded& l) {
        return l.handle.version == version;
      }));
    }
  }
  state.phase = ModelState::Phase::kReady;
  state.version = serving.front().handle.version;
  state.directory = serving.front().directory;
  state.versions = verdict.serving;
  state.reason = verdict.reason;
  Publish(state, std::move(serving));
  for (const Loaded& retired : previous_versions) {
    if (!absl::c_linear_search(verdict.retired, retired.handle.version)) continue;
    spdlog::info("event=model_unloaded model={} version={} calls_in_flight={} reason=\"{}\"",
                 name, retired.handle.version, retired.handle.model->calls_in_flight(),
                 "its version policy no longer serves it");
  }
  if (!verdict.failures.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("model '", name, "': ", verdict.reason,
                                                      "; serving ", VersionList(state.versions)));
  }
  return state;
}

StepResult ModelRepository::LoadVersion(const std::string& name, int64_t version,
                                        const std::string& directory,
                                        const std::string& fingerprint,
                                        const ModelState& config,
                                        bool reloaded,
                                        absl::flat_hash_map<int64_t, Loaded>& loaded) {
  auto failed = [&](absl::string_view message, absl::string_view why) {
    return StepResult{version, StepResult::Kind::kFailed,
                      {version, std::string(message),
                       absl::StrCat("version ", version, " ", why, ": ", message)}};
  };
  const absl::Time start = absl::Now();
  LoadOptions load_options = options_.load_options;
  load_options.name = name;
  if (config.instances.count > 0) load_options.runners_per_variant = config.instances.count;
  absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
      options_.loader ? options_.loader(directory, load_options)
                      : LoadedVersion::Load(directory, load_options);
  if (!model.ok()) return failed(model.status().message(), "failed to load");
  if (absl::Status placed = CheckInstanceKind((*model)->manifest().device(), config.instances);
      !placed.ok()) {
    return failed(placed.message(), "cannot be served as its config.pbtxt asks");
  }
  if (config.batching != nullptr) {
    if (absl::Status batchable = CheckBatchable((*model)->entry_frame()); !batchable.ok()) {
      return failed(batchable.message(), "cannot be served as its config.pbtxt asks");
    }
  }
  if (config.sequences != nullptr) {
    if (absl::Status keeps = CheckSequenceState((*model)->entry_frame(), *config.sequences);
        !keeps.ok()) {
      return failed(keeps.message(), "cannot be served as its config.pbtxt asks");
    }
  }
  std::shared_ptr<ModelRecorder> metrics;
  if (options_.metrics_factory) {
    metrics = options_.metrics_factory(name, version, **model);
    (*model)->SetObserver(metrics);
  }
  spdlog::info("event=model_loaded model={} version={} directory={} complete={} duration_ms={}{}",
               name, version, directory, (*model)->manifest().summary().complete(),
               absl::ToInt64Milliseconds(absl::Now() - start), reloaded ? " reloaded=true" : "");
  loaded.emplace(version,
                 Loaded{Handle{*std::move(model), version, std::move(metrics)}, directory, fingerprint});
  return StepResult{version, StepResult::Kind::kLoaded, {}};
}

absl::StatusOr<ModelState> ModelRepository::Load(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  return LoadLocked(name, /*reload=*/true);
}

absl::StatusOr<ModelState> ModelRepository::Unload(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::optional<ModelState> served = Retire(name, "unloaded on request", true);
  if (!served) {
    // A model whose load failed is not served, but its failure is what an
    // operator unloads it to be rid of.
    if (std::optional<ModelState> failed = ForgetFailure(name, "unloaded on request")) {
      std::lock_guard<std::mutex> lock(mu_);
      models_[name].unloaded = true;
      return *failed;
    }
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not loaded"));
  }
  ModelState state = *served;
  state.phase = ModelState::Phase::kUnavailable;
  state.reason = "unloaded on request";
  return state;
}

std::vector<ModelState> ModelRepository::Rescan() {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::error_code ec;
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(options_.root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && IsPlainName(name)) found.push_back(name);
  }
  if (ec) {
    spdlog::error("event=repository_scan_failed root={} reason=\"{}\"", options_.root,
                  ec.message());
  }
  std::sort(found.begin(), found.end());
  for (const std::string& name : found) {
    const fs::path model_dir = fs::path(options_.root) / name;
    const auto versions = Versions(model_dir);
    ModelOnDisk disk;
    for (const auto& [version, directory] : versions) disk.versions.push_back(version);
    if (!versions.empty()) disk.fingerprint = ModelFingerprint(model_dir, FingerprintVersions(versions));
    std::optional<ModelKnown> known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = models_.find(name); it != models_.end()) known = Known(it->second);
    }
    switch (DecideRescan(&disk, known ? &*known : nullptr)) {
      case RescanAction::kLoad:
        (void)LoadLocked(name, /*reload=*/false);
        break;
      case RescanAction::kForgetFailure:
        ForgetFailure(name, "its directory holds no versions");
        break;
      default:
        break;
    }
  }
  std::vector<std::pair<std::string, RescanAction>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, entry] : models_) {
      if (std::binary_search(found.begin(), found.end(), name)) continue;
      const ModelKnown known = Known(entry);
      const RescanAction action = DecideRescan(nullptr, &known);
      if (action != RescanAction::kKeep) gone.emplace_back(name, action);
    }
  }
  constexpr char kRemoved[] = "its directory was removed from the repository";
  for (const auto& [name, action] : gone) {
    if (action == RescanAction::kRetire) Retire(name, kRemoved, false);
    if (action == RescanAction::kForgetFailure) ForgetFailure(name, kRemoved);
  }
  return List();
}

absl::StatusOr<ModelRepository::Handle> ModelRepository::Get(
    absl::string_view name, absl::string_view version) const {
  // Every request calls this: while the repository is unchanged it reads one
  // shared atomic and this thread's copy of the answers, and takes no lock.
  thread_local ThreadAnswers mine;
  if (mine.repository != id_ || mine.generation != generation_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu_);
    mine = {id_, generation_.load(std::memory_order_relaxed), answers_};
  }
  if (auto found = Find(*mine.answers, name, version)) return *std::move(found);
  // The version this thread's answers name was replaced and is gone: the
  // current answers, under the lock, name versions that are alive.
  std::lock_guard<std::mutex> lock(mu_);
  mine = {id_, generation_.load(std::memory_order_relaxed), answers_};
  return *Find(*mine.answers, name, version);
}

absl::StatusOr<std::vector<ModelRepository::Handle>> ModelRepository::GetVersions(
    absl::string_view name) const {
  // Under the lock the current answers name versions that are alive.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = answers_->find(name);
  if (it == answers_->end()) {
    return absl::NotFoundError(absl::StrCat("unknown model '", QuotedByClient(name), "'"));
  }
  if (!it->second.unavailable.ok()) return it->second.unavailable;
  std::vector<Handle> handles;
  for (const Answer::Version& v : it->second.versions) {
    handles.push_back(
        Handle{v.model.lock(), v.version, v.metrics.lock(), it->second.max_request_time,
               it->second.batching, it->second.sequences});
  }
  return handles;
}

std::optional<absl::StatusOr<ModelRepository::Handle>> ModelRepository::Find(
    const Answers& answers, absl::string_view name, absl::string_view version) {
  auto it = answers.find(name);
  if (it == answers.end()) {
    return absl::NotFoundError(absl::StrCat("unknown model '", QuotedByClient(name), "'"));
  }
  const Answer& answer = it->second;
  if (!answer.unavailable.ok()) return answer.unavailable;
  const Answer::Version* chosen = &answer.versions.front();
  if (!version.empty()) {
    int64_t wanted = 0;
    chosen = nullptr;
    if (absl::SimpleAtoi(version, &wanted)) {
      for (const Answer::Version& v : answer.versions) {
        if (v.version == wanted) chosen = &v;
      }
    }
    if (chosen == nullptr) {
      std::vector<int64_t> served;
      for (const Answer::Version& v : answer.versions) served.push_back(v.version);
      return absl::NotFoundError(absl::StrCat("version '", QuotedByClient(version), "' of model '", name,
                                              "' is not served (serving ", VersionList(served),
                                              ")"));
    }
  }
  std::shared_ptr<LoadedVersion> model = chosen->model.lock();
  if (!model) return std::nullopt;
  return Handle{std::move(model), chosen->version, chosen->metrics.lock(),
                answer.max_request_time, answer.batching, answer.sequences};
}

std::vector<ModelState> ModelRepository::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelState> states;
  for (const auto& [name, entry] : models_) states.push_back(entry.state);
  std::sort(states.begin(), states.end(),
            [](const ModelState& a, const ModelState& b) { return a.name < b.name; });
  return states;
}

std::vector<std::pair<ModelState, ModelRepository::Handle>> ModelRepository::Served() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<ModelState, Handle>> served;
  for (const auto& [name, entry] : models_) {
    for (const Loaded& loaded : entry.versions) served.emplace_back(entry.state, loaded.handle);
  }
  return served;
}

}  // namespace precompile::server
