#include "server/model_repository.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/model_config.pb.h"
#include "server/repository_policy.h"

namespace precompile::server {
namespace {

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

// What a model looks like to a rescan: its newest version's files and its
// config.pbtxt (size and modification time, or none), so that fixing either
// retries a failed load.
std::string ModelFingerprint(const fs::path& model_dir, const std::string& newest_version_dir) {
  std::error_code ec;
  const fs::path config = model_dir / "config.pbtxt";
  std::string config_part = "none";
  if (fs::is_regular_file(config, ec)) {
    config_part = absl::StrCat(fs::file_size(config, ec), "/",
                               fs::last_write_time(config, ec).time_since_epoch().count());
  }
  return absl::StrCat(Fingerprint(newest_version_dir), "|", config_part);
}

class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first.empty()) first = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  std::string first;
};

// The model's optional config.pbtxt (Triton's ModelConfig in text format).
// Fields this server does not know are ignored, as long as they are written
// without list brackets (protobuf's parser cannot skip `f [ {...} ]` of an
// unknown field). It may name the model (as its directory) and ask for the
// version policy the server has: the newest version that loads. Another
// policy is refused, not ignored.
absl::Status CheckModelConfig(const std::string& name, const fs::path& model_dir) {
  const fs::path path = model_dir / "config.pbtxt";
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::OkStatus();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot be read"));
  inference::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowUnknownField(true);
  FirstError error;
  parser.RecordErrorsTo(&error);
  if (!parser.ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("config.pbtxt:", error.first));
  }
  if (!config.name().empty() && config.name() != name) {
    return absl::InvalidArgumentError(absl::StrCat("config.pbtxt names the model '", config.name(),
                                                   "', its directory '", name, "'"));
  }
  if (config.has_version_policy() &&
      !(config.version_policy().has_latest() &&
        config.version_policy().latest().num_versions() <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.pbtxt: version_policy { ", config.version_policy().ShortDebugString(),
        " } is not supported: the server serves the newest version that loads, "
        "version_policy { latest { num_versions: 1 } }"));
  }
  return absl::OkStatus();
}

std::atomic<uint64_t> next_repository_id{1};

}  // namespace

ModelKnown ModelRepository::Known(const Entry& entry) {
  ModelKnown known;
  known.served_version = entry.model ? entry.state.version : 0;
  known.attempted_version = entry.attempted_version;
  known.attempted_fingerprint = entry.attempted_fingerprint;
  known.unloaded_on_request = entry.unloaded;
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
    if (entry.model) {
      answer.model = entry.model;
      answer.version = entry.state.version;
      answer.metrics = entry.metrics;
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

void ModelRepository::Publish(const ModelState& state,
                              const std::shared_ptr<LoadedVersion>& model,
                              std::shared_ptr<ModelMetrics> metrics) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = models_[state.name];
    entry.state = state;
    entry.model = model;
    entry.metrics = std::move(metrics);
    Changed();
  }
  if (listener_) listener_->OnModelState(state, model);
}

std::optional<ModelState> ModelRepository::Retire(const std::string& name,
                                                  const std::string& reason,
                                                  bool on_request) {
  std::shared_ptr<LoadedVersion> model;
  ModelState state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(name);
    if (it == models_.end() || !it->second.model) return std::nullopt;
    model = std::move(it->second.model);
    state = it->second.state;
    it->second.unloaded = on_request;
    Changed();
  }
  const ModelState served = state;
  state.phase = ModelState::Phase::kUnavailable;
  state.reason = reason;
  Publish(state, nullptr);
  spdlog::info("event=model_unloaded model={} version={} calls_in_flight={} reason=\"{}\"",
               name, served.version, model->calls_in_flight(), reason);
  return served;
}

absl::StatusOr<ModelState> ModelRepository::LoadLocked(const std::string& name) {
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
  std::shared_ptr<LoadedVersion> previous_model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = models_.find(name); it != models_.end()) {
      previous = it->second.state;
      previous_model = it->second.model;
    }
  }
  ModelState state;
  state.name = name;
  if (!previous_model) {
    state.phase = ModelState::Phase::kLoading;
    Publish(state, nullptr);
  }

  const auto versions = Versions(model_dir);
  if (versions.empty()) {
    const std::string reason =
        "no version directory (a positive integer) holds an artifact";
    if (!previous_model) {
      state.phase = ModelState::Phase::kUnavailable;
      state.reason = reason;
      state.failed = true;
      Publish(state, nullptr);
    }
    spdlog::warn("event=model_load_failed model={} reason=\"{}\"", name, reason);
    return absl::FailedPreconditionError(absl::StrCat("model '", name, "': ", reason));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = models_[name];
    entry.attempted_version = versions.front().first;
    entry.attempted_fingerprint = ModelFingerprint(model_dir, versions.front().second);
    entry.unloaded = false;
    Changed();
  }
  std::vector<int64_t> on_disk;
  absl::flat_hash_map<int64_t, std::string> directories;
  for (const auto& [version, directory] : versions) {
    on_disk.push_back(version);
    directories.emplace(version, directory);  // "01" and "1": the first listed.
  }
  std::string newest_failure;
  // A config the server refuses leaves nothing to try: what is served stays.
  std::vector<int64_t> to_try;
  if (absl::Status config = CheckModelConfig(name, model_dir); !config.ok()) {
    newest_failure = std::string(config.message());
    spdlog::error("event=model_load_failed model={} reason=\"{}\"", name, newest_failure);
    if (listener_) listener_->OnLoadFailure(name, versions.front().first, newest_failure);
  } else {
    to_try = VersionsToTry(on_disk, previous_model ? previous.version : 0);
  }
  for (const int64_t version : to_try) {
    const std::string& directory = directories.at(version);
    const absl::Time start = absl::Now();
    LoadOptions load_options = options_.load_options;
    load_options.name = name;
    absl::StatusOr<std::shared_ptr<LoadedVersion>> model =
        options_.loader ? options_.loader(directory, load_options)
                        : LoadedVersion::Load(directory, load_options);
    if (!model.ok()) {
      spdlog::error("event=model_load_failed model={} version={} reason=\"{}\"", name,
                    version, std::string(model.status().message()));
      if (listener_) {
        listener_->OnLoadFailure(name, version, std::string(model.status().message()));
      }
      if (newest_failure.empty()) {
        newest_failure = absl::StrCat("version ", version, " failed to load: ",
                                      model.status().message());
      }
      continue;
    }
    std::shared_ptr<ModelMetrics> metrics;
    if (options_.metrics_factory) {
      metrics = options_.metrics_factory(name, version, **model);
      (*model)->SetObserver(metrics);
    }
    state.version = version;
    state.directory = directory;
    state.phase = ModelState::Phase::kReady;
    state.reason = newest_failure;
    Publish(state, *model, std::move(metrics));
    spdlog::info(
        "event=model_loaded model={} version={} directory={} complete={} "
        "duration_ms={}{}",
        name, version, directory, (*model)->manifest().summary().complete(),
        absl::ToInt64Milliseconds(absl::Now() - start),
        previous_model ? absl::StrCat(" replaced_version=", previous.version) : "");
    if (!newest_failure.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", name, "': ", newest_failure, "; serving version ", version));
    }
    return state;
  }
  // Nothing loaded: keep serving what was served, if anything.
  if (previous_model) {
    std::shared_ptr<ModelMetrics> previous_metrics;
    {
      std::lock_guard<std::mutex> lock(mu_);
      previous_metrics = models_[name].metrics;
    }
    previous.reason = newest_failure;
    Publish(previous, previous_model, std::move(previous_metrics));
  } else {
    state.phase = ModelState::Phase::kUnavailable;
    state.reason = newest_failure;
    state.failed = true;
    Publish(state, nullptr);
  }
  return absl::FailedPreconditionError(absl::StrCat("model '", name, "': ", newest_failure));
}

absl::StatusOr<ModelState> ModelRepository::Load(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  return LoadLocked(name);
}

absl::StatusOr<ModelState> ModelRepository::Unload(const std::string& name) {
  std::lock_guard<std::mutex> load_lock(load_mu_);
  std::optional<ModelState> served = Retire(name, "unloaded on request", true);
  if (!served) {
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
    const auto versions = Versions(fs::path(options_.root) / name);
    ModelOnDisk disk;
    for (const auto& [version, directory] : versions) disk.versions.push_back(version);
    if (!versions.empty()) {
      disk.newest_fingerprint =
          ModelFingerprint(fs::path(options_.root) / name, versions.front().second);
    }
    std::optional<ModelKnown> known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = models_.find(name); it != models_.end()) known = Known(it->second);
    }
    if (DecideRescan(&disk, known ? &*known : nullptr) == RescanAction::kLoad) {
      (void)LoadLocked(name);
    }
  }
  std::vector<std::string> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, entry] : models_) {
      if (std::binary_search(found.begin(), found.end(), name)) continue;
      const ModelKnown known = Known(entry);
      if (DecideRescan(nullptr, &known) == RescanAction::kRetire) gone.push_back(name);
    }
  }
  for (const std::string& name : gone) {
    Retire(name, "its directory was removed from the repository", false);
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

std::optional<absl::StatusOr<ModelRepository::Handle>> ModelRepository::Find(
    const Answers& answers, absl::string_view name, absl::string_view version) {
  auto it = answers.find(name);
  if (it == answers.end()) {
    return absl::NotFoundError(absl::StrCat("unknown model '", name, "'"));
  }
  const Answer& answer = it->second;
  if (!answer.unavailable.ok()) return answer.unavailable;
  if (!version.empty()) {
    int64_t wanted = 0;
    if (!absl::SimpleAtoi(version, &wanted) || wanted != answer.version) {
      return absl::NotFoundError(absl::StrCat("version '", version, "' of model '", name,
                                              "' is not served (serving version ",
                                              answer.version, ")"));
    }
  }
  std::shared_ptr<LoadedVersion> model = answer.model.lock();
  if (!model) return std::nullopt;
  return Handle{std::move(model), answer.version, answer.metrics.lock()};
}

std::vector<ModelState> ModelRepository::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelState> states;
  for (const auto& [name, entry] : models_) states.push_back(entry.state);
  std::sort(states.begin(), states.end(),
            [](const ModelState& a, const ModelState& b) { return a.name < b.name; });
  return states;
}

std::vector<std::pair<ModelState, std::shared_ptr<LoadedVersion>>> ModelRepository::Served()
    const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<ModelState, std::shared_ptr<LoadedVersion>>> served;
  for (const auto& [name, entry] : models_) {
    if (entry.model) served.emplace_back(entry.state, entry.model);
  }
  return served;
}

}  // namespace precompile::server
