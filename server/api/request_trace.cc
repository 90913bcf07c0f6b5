#include "server/api/request_trace.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json_text.h"
#include "base/log_text.h"

namespace precompile::server {
namespace {

constexpr int64_t kDefaultRate = 1000;
// A request id is the client's: the trace keeps its start.
constexpr size_t kMaxRequestIdBytes = 256;

absl::StatusOr<int64_t> ParseInteger(absl::string_view name, const std::vector<std::string>& values,
                                     int64_t min) {
  int64_t n = 0;
  if (values.size() != 1 || !absl::SimpleAtoi(values[0], &n) || n < min) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trace setting ", name, " takes one integer of at least ", min, ", not [",
        LoggedText(absl::StrJoin(values, ", "), 64), "]"));
  }
  return n;
}

int64_t Nanos(absl::Time t) { return absl::ToUnixNanos(t); }

}  // namespace

RequestTracer::RequestTracer(std::string file, TraceConfig server) : file_(std::move(file)) {
  if (!server.timestamps) server.timestamps = false;
  if (!server.rate) server.rate = kDefaultRate;
  if (!server.count) server.count = -1;
  if (!server.log_frequency) server.log_frequency = 0;
  std::lock_guard<std::mutex> lock(mu_);
  server_.own = server;
  UpdateEnabledLocked();
}

RequestTracer::~RequestTracer() {
  std::lock_guard<std::mutex> lock(file_mu_);
  FinishFileLocked();
}

absl::StatusOr<TraceConfig> RequestTracer::Parse(const Changes& changes, bool allow_clear) {
  TraceConfig config;
  for (const auto& [name, values] : changes) {
    if (name == "trace_file") {
      return absl::InvalidArgumentError(
          "trace setting trace_file is set only by the server's --trace_file: a client may not "
          "choose where the server writes");
    }
    if (name != "trace_level" && name != "trace_rate" && name != "trace_count" &&
        name != "log_frequency") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown trace setting '", LoggedText(name, 64),
          "' (known: trace_level, trace_rate, trace_count, log_frequency, trace_file)"));
    }
    if (!values) {
      if (!allow_clear) {
        return absl::InvalidArgumentError(absl::StrCat(
            "trace setting ", name, " of the server cannot be cleared, only changed"));
      }
      continue;  // Cleared: stays unset.
    }
    if (name == "trace_level") {
      bool timestamps = false;
      for (const std::string& v : *values) {
        if (v == "TIMESTAMPS") {
          timestamps = true;
        } else if (v != "OFF") {
          return absl::InvalidArgumentError(absl::StrCat(
              "trace_level '", LoggedText(v, 64),
              "' is not supported (OFF or TIMESTAMPS; TENSORS is not traced by this server)"));
        }
      }
      config.timestamps = timestamps;
    } else if (name == "trace_rate") {
      absl::StatusOr<int64_t> n = ParseInteger(name, *values, 1);
      if (!n.ok()) return n.status();
      config.rate = *n;
    } else if (name == "trace_count") {
      absl::StatusOr<int64_t> n = ParseInteger(name, *values, -1);
      if (!n.ok()) return n.status();
      config.count = *n;
    } else {
      absl::StatusOr<int64_t> n = ParseInteger(name, *values, 0);
      if (!n.ok()) return n.status();
      config.log_frequency = *n;
    }
  }
  return config;
}

TraceConfig RequestTracer::EffectiveLocked(const Level* model) const {
  TraceConfig c = server_.own;
  if (model == nullptr) return c;
  if (model->own.timestamps) c.timestamps = model->own.timestamps;
  if (model->own.rate) c.rate = model->own.rate;
  if (model->own.count) c.count = model->own.count;
  return c;
}

void RequestTracer::UpdateEnabledLocked() {
  bool enabled = *server_.own.timestamps && *server_.own.count != 0;
  for (const auto& [name, level] : models_) {
    const TraceConfig c = EffectiveLocked(&level);
    enabled = enabled || (*c.timestamps && *c.count != 0);
  }
  enabled_.store(enabled, std::memory_order_relaxed);
}

RequestTracer::Settings RequestTracer::SettingsOf(const TraceConfig& c) const {
  return {{"trace_level", {*c.timestamps ? "TIMESTAMPS" : "OFF"}},
          {"trace_rate", {absl::StrCat(*c.rate)}},
          {"trace_count", {absl::StrCat(*c.count)}},
          {"log_frequency", {absl::StrCat(*c.log_frequency)}},
          {"trace_file", {file_}}};
}

RequestTracer::Settings RequestTracer::Get(absl::string_view model) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = models_.find(model);
  return SettingsOf(EffectiveLocked(it == models_.end() ? nullptr : &it->second));
}

absl::StatusOr<RequestTracer::Settings> RequestTracer::Update(absl::string_view model,
                                                              const Changes& changes) {
  const bool for_model = !model.empty();
  absl::StatusOr<TraceConfig> parsed = Parse(changes, for_model);
  if (!parsed.ok()) return parsed.status();
  if (for_model && parsed->log_frequency) {
    return absl::InvalidArgumentError(
        "trace setting log_frequency is the server's (every model's traces share its file), "
        "not a model's");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  Level* level = for_model ? (it == models_.end() ? nullptr : &it->second) : &server_;
  TraceConfig next = level != nullptr ? level->own : TraceConfig{};
  for (const auto& [name, values] : changes) {
    if (values) continue;
    if (name == "trace_level") next.timestamps.reset();
    if (name == "trace_rate") next.rate.reset();
    if (name == "trace_count") next.count.reset();
  }
  if (parsed->timestamps) next.timestamps = parsed->timestamps;
  if (parsed->rate) next.rate = parsed->rate;
  if (parsed->count) next.count = parsed->count;
  if (parsed->log_frequency) next.log_frequency = parsed->log_frequency;
  const Level candidate{next, 0};
  const TraceConfig effective = for_model ? EffectiveLocked(&candidate) : next;
  if (*effective.timestamps && file_.empty()) {
    return absl::FailedPreconditionError(
        "tracing needs a trace file: the server was started without --trace_file");
  }
  const bool keeps_own = !for_model || next.timestamps || next.rate || next.count;
  if (!keeps_own) {
    if (it != models_.end()) models_.erase(it);  // Follows the server's again.
  } else {
    if (level == nullptr) level = &models_[model];
    if (next.rate != level->own.rate) level->seen = 0;
    level->own = next;
  }
  UpdateEnabledLocked();
  it = models_.find(model);
  return SettingsOf(EffectiveLocked(it == models_.end() ? nullptr : &it->second));
}

uint64_t RequestTracer::Sample(absl::string_view model) {
  if (!enabled_.load(std::memory_order_relaxed)) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(model);
  Level* level = it == models_.end() ? &server_ : &it->second;
  const TraceConfig c = EffectiveLocked(it == models_.end() ? nullptr : &it->second);
  if (!*c.timestamps || *c.count == 0) return 0;
  if (++level->seen < *c.rate) return 0;
  level->seen = 0;
  if (*c.count > 0) {
    // The count that applies is the model's own if it has one.
    TraceConfig& owner = level->own.count ? level->own : server_.own;
    *owner.count -= 1;
    if (*owner.count == 0) UpdateEnabledLocked();
  }
  return ++next_id_;
}

void RequestTracer::Write(const RequestTrace& trace) {
  // Three objects, as Triton writes a trace; DumpJson keeps the file valid
  // JSON whatever bytes a client's request id holds.
  Json header = Json::object();
  header["id"] = trace.id;
  header["model_name"] = trace.model;
  header["model_version"] = trace.version;
  header["request_id"] = trace.request_id.substr(0, kMaxRequestIdBytes);
  header["outcome"] = trace.outcome;
  Json timestamps = Json::array();
  for (const auto& [name, time] : trace.timestamps) {
    timestamps.push_back({{"name", name}, {"ns", Nanos(time)}});
  }
  Json frames = Json::array();
  for (const FrameCallEvent& f : trace.frame_calls) {
    frames.push_back({{"frame", f.frame},
                      {"entry", f.is_entry},
                      {"outcome", std::string(OutcomeName(f.outcome))},
                      {"variant", f.variant_id},
                      {"guards_ns", absl::ToInt64Nanoseconds(f.dispatch_time)},
                      {"run_ns", absl::ToInt64Nanoseconds(f.run_time)}});
  }
  const std::string text = absl::StrCat(
      DumpJson(header, /*pretty=*/false), ",\n",
      DumpJson({{"id", trace.id}, {"timestamps", std::move(timestamps)}}, /*pretty=*/false),
      ",\n", DumpJson({{"id", trace.id}, {"frames", std::move(frames)}}, /*pretty=*/false));

  int64_t log_frequency = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    log_frequency = *server_.own.log_frequency;
  }
  std::lock_guard<std::mutex> lock(file_mu_);
  if (file_.empty()) return;
  if (out_ == nullptr) {
    const std::string path =
        log_frequency > 0 ? absl::StrCat(file_, ".", file_index_) : file_;
    out_ = std::fopen(path.c_str(), "w");
    if (out_ == nullptr) {
      if (!write_failed_) {
        spdlog::error("event=trace_file_failed file=\"{}\" error=\"{}\"", LoggedText(path, 512),
                      std::strerror(errno));
      }
      write_failed_ = true;
      return;
    }
    std::fputs("[\n", out_);
    in_file_ = 0;
  }
  if (in_file_ > 0) std::fputs(",\n", out_);
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
  ++in_file_;
  if (log_frequency > 0 && in_file_ >= log_frequency) {
    FinishFileLocked();
    ++file_index_;
  }
}

void RequestTracer::FinishFileLocked() {
  if (out_ == nullptr) return;
  std::fputs("\n]\n", out_);
  std::fclose(out_);
  out_ = nullptr;
}

}  // namespace precompile::server
