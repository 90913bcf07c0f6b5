#include "client/load_generator.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/infer_request.h"
#include "client/table.h"

namespace precompile::client {
namespace {

using Clock = std::chrono::steady_clock;

// One phase: a closed loop at one concurrency, or the open loop.
class Phase : public std::enable_shared_from_this<Phase> {
 public:
  Phase(InferenceClient& client, const std::vector<RequestTemplate>& mix,
        const LoadOptions& options, uint64_t seed)
      : client_(client), mix_(mix), options_(options), rng_(seed) {
    std::vector<double> weights;
    for (const RequestTemplate& t : mix) weights.push_back(t.weight);
    pick_ = std::discrete_distribution<int>(weights.begin(), weights.end());
    call_.timeout = options.timeout;
    call_.max_attempts = options.max_attempts;
  }

  PhaseReport Closed(int concurrency) {
    report_.name = absl::StrCat("concurrency=", concurrency);
    report_.concurrency = concurrency;
    closed_ = true;
    Begin();
    std::thread progress([this] { Progress(); });
    for (int i = 0; i < concurrency; ++i) {
      const Clock::time_point now = Clock::now();
      bool record = false;
      Step step;
      {
        std::lock_guard<std::mutex> lock(mu_);
        step = NextLocked(now, &record);
      }
      if (step.index >= 0) Send(step, record, now);
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [this] { return Done(); });
    }
    progress.join();
    return End();
  }

  PhaseReport Open(double rate) {
    report_.name = absl::StrFormat("rate=%g/s", rate);
    report_.rate = rate;
    closed_ = false;
    Begin();
    std::thread progress([this] { Progress(); });
    std::exponential_distribution<double> poisson_gap(rate);
    Clock::time_point next = start_;
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (options_.requests > 0 ? recorded_sent_ >= options_.requests : next >= measure_end_) {
          stopped_ = true;
          done_.notify_all();
          break;
        }
      }
      std::this_thread::sleep_until(next);
      const bool record = next >= measure_start_;
      Step step;
      double gap = 1.0 / rate;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (outstanding_ >= options_.max_outstanding) {
          if (record) ++report_.skipped;
        } else {
          ++outstanding_;
          if (record) ++recorded_sent_;
          step.index = pick_(rng_);
        }
        if (options_.arrivals == Arrivals::kPoisson) gap = poisson_gap(rng_);
      }
      if (step.index >= 0) Send(step, record, next);
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap));
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_.wait(lock, [this] { return Done(); });
    }
    progress.join();
    return End();
  }

 private:
  // What to send: a template, and for a sequence template which of its
  // requests under which id.
  struct Step {
    int index = -1;
    size_t request = 0;
    int64_t sequence_id = 0;
  };

  void Begin() {
    start_ = Clock::now();
    measure_start_ = start_ + absl::ToChronoNanoseconds(options_.warmup);
    measure_end_ = measure_start_ + absl::ToChronoNanoseconds(options_.duration);
  }

  PhaseReport End() {
    std::lock_guard<std::mutex> lock(mu_);
    if (report_.requests > 0) report_.elapsed = absl::FromChrono(last_completion_ - measure_start_);
    return std::move(report_);
  }

  bool Done() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopped_ && outstanding_ == 0; }

  // Closed loop: whether another request is to be sent now (false when the
  // phase is over). Counts it as outstanding.
  bool AdmitLocked(Clock::time_point now, bool* record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopped_) return false;
    *record = now >= measure_start_;
    if (*record) {
      if (options_.requests > 0 ? recorded_sent_ >= options_.requests : now >= measure_end_) {
        stopped_ = true;
        done_.notify_all();
        return false;
      }
      ++recorded_sent_;
    }
    ++outstanding_;
    return true;
  }

  // Closed loop: a new draw from the mix (a sequence template starts a
  // sequence of a new id), or index -1 when the phase is over.
  Step NextLocked(Clock::time_point now, bool* record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step step;
    if (!AdmitLocked(now, record)) return step;
    step.index = pick_(rng_);
    if (!mix_[step.index].sequence.empty()) {
      step.sequence_id = sequence_ids_(rng_);
      if (*record) ++report_.sequences_started;
    }
    return step;
  }

  // REQUIRES: mu_ not held (the callback may run before InferAsync returns).
  // The callback keeps the phase alive: it may run after the thread that
  // waits for the phase has seen it done and moved on.
  void Send(const Step& step, bool record, Clock::time_point start) {
    const RequestTemplate& t = mix_[step.index];
    std::shared_ptr<const inference::ModelInferRequest> request = t.request;
    if (!t.sequence.empty()) {
      auto named = std::make_shared<inference::ModelInferRequest>(*t.sequence[step.request]);
      (*named->mutable_parameters())["sequence_id"].set_int64_param(step.sequence_id);
      request = std::move(named);
    }
    client_.InferAsync(std::move(request), call_,
                       [self = shared_from_this(), step, record,
                        start](absl::StatusOr<inference::ModelInferResponse> result) {
                         self->OnDone(step, record, start, result);
                       });
  }

  void OnDone(const Step& step, bool record, Clock::time_point start,
              const absl::StatusOr<inference::ModelInferResponse>& result) {
    const Clock::time_point end = Clock::now();
    const int index = step.index;
    const size_t requests = mix_[index].sequence.size();
    Step next;
    bool next_record = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (record) {
        const absl::Duration latency = absl::FromChrono(end - start);
        std::string code = absl::StatusCodeToString(result.status().code());
        std::string outcome = code;
        if (result.ok()) {
          outcome = PrecompileParameter(*result, "precompile_outcome");
          if (outcome.empty()) outcome = "ok";
        }
        ++report_.requests;
        report_.latency.Record(latency);
        ++report_.status_codes[code];
        ++report_.outcomes[outcome];
        report_.outcome_latency[outcome].Record(latency);
        ++report_.templates[mix_[index].name][outcome];
        last_completion_ = std::max(last_completion_, end);
      }
      ++completed_;
      if (record && result.ok() && requests > 0 && step.request + 1 == requests) {
        ++report_.sequences_completed;
      }
      // The next request is counted before this one is uncounted, so that
      // the phase is never seen done while the loop goes on. A sequence goes
      // on with its next request; one whose request failed is left (the
      // server drops it once idle) and the loop draws again, as at the end.
      if (closed_) {
        if (result.ok() && step.request + 1 < requests) {
          if (AdmitLocked(end, &next_record)) {
            next = step;
            ++next.request;
          }
        } else {
          next = NextLocked(end, &next_record);
        }
      }
      --outstanding_;
      if (Done()) done_.notify_all();
    }
    if (next.index >= 0) Send(next, next_record, end);
  }

  // A line every progress_interval until the phase is done.
  void Progress() {
    std::unique_lock<std::mutex> lock(mu_);
    if (options_.progress == nullptr) {
      done_.wait(lock, [this] { return Done(); });
      return;
    }
    Clock::time_point last_time = start_;
    int64_t last_completed = 0;
    while (!done_.wait_for(lock, absl::ToChronoNanoseconds(options_.progress_interval),
                           [this] { return Done(); })) {
      const Clock::time_point now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - start_).count();
      const double window = std::chrono::duration<double>(now - last_time).count();
      const double per_second = window > 0 ? (completed_ - last_completed) / window : 0;
      std::string line = absl::StrFormat(
          "[%s] %5.1fs %s  done %d  %.0f req/s  outstanding %d", report_.name, seconds,
          now < measure_start_ ? "warmup " : "measure", completed_, per_second, outstanding_);
      if (report_.requests > 0) {
        absl::StrAppendFormat(&line, "  p50 %.3f ms  p99 %.3f ms  errors %d",
                              absl::ToDoubleMilliseconds(report_.latency.Percentile(50)),
                              absl::ToDoubleMilliseconds(report_.latency.Percentile(99)),
                              report_.errors());
      }
      if (report_.skipped > 0) absl::StrAppend(&line, "  skipped ", report_.skipped);
      last_time = now;
      last_completed = completed_;
      lock.unlock();
      *options_.progress << line << std::endl;
      lock.lock();
    }
  }

  InferenceClient& client_;
  const std::vector<RequestTemplate>& mix_;
  const LoadOptions& options_;
  CallOptions call_;
  bool closed_ = true;
  Clock::time_point start_, measure_start_, measure_end_;

  // std::mutex, not absl::Mutex: see base/notification.h.
  std::mutex mu_;
  std::condition_variable done_;  // Done() may have become true
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::discrete_distribution<int> pick_ ABSL_GUARDED_BY(mu_);
  // Positive, and within Triton's int64 sequence ids.
  std::uniform_int_distribution<int64_t> sequence_ids_ ABSL_GUARDED_BY(mu_){1, int64_t{1} << 62};
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int64_t recorded_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point last_completion_ ABSL_GUARDED_BY(mu_);
  PhaseReport report_ ABSL_GUARDED_BY(mu_);
};

Json LatencyJson(const LatencyHistogram& h) {
  Json json = Json::object();
  auto ms = [](absl::Duration d) { return JsonDouble(absl::ToDoubleMilliseconds(d), 6); };
  json["min"] = ms(h.min());
  json["mean"] = ms(h.mean());
  json["p50"] = ms(h.Percentile(50));
  json["p90"] = ms(h.Percentile(90));
  json["p99"] = ms(h.Percentile(99));
  json["p99_9"] = ms(h.Percentile(99.9));
  json["max"] = ms(h.max());
  return json;
}

Json CountsJson(const std::map<std::string, int64_t>& counts) {
  Json json = Json::object();
  for (const auto& [key, n] : counts) json[key] = n;
  return json;
}

std::string Milliseconds(absl::Duration d) {
  return absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(d));
}

}  // namespace

double PhaseReport::throughput() const {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? requests / seconds : 0;
}

int64_t PhaseReport::errors() const {
  int64_t errors = 0;
  for (const auto& [code, n] : status_codes) {
    if (code != "OK") errors += n;
  }
  return errors;
}

LoadGenerator::LoadGenerator(InferenceClient& client, std::vector<RequestTemplate> mix,
                             LoadOptions options)
    : client_(client), mix_(std::move(mix)), options_(std::move(options)) {}

absl::StatusOr<LoadReport> LoadGenerator::Run() {
  if (mix_.empty()) return absl::InvalidArgumentError("the request mix is empty");
  if (options_.rate < 0) return absl::InvalidArgumentError("the rate must be > 0");
  if (options_.rate == 0) {
    if (options_.concurrency.empty()) return absl::InvalidArgumentError("no concurrency level");
    for (int c : options_.concurrency) {
      if (c < 1) return absl::InvalidArgumentError("concurrency levels must be >= 1");
    }
  }
  if (options_.max_outstanding < 1) {
    return absl::InvalidArgumentError("max_outstanding must be >= 1");
  }
  if (options_.requests < 0 ||
      (options_.requests == 0 && options_.duration <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError("give a duration > 0 or a number of requests > 0");
  }
  if (options_.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the warmup must be >= 0");
  }
  if (options_.rate > 0) {
    for (const RequestTemplate& t : mix_) {
      if (!t.sequence.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "template '", t.name, "' sends sequences, whose requests go one after the answer to "
            "the other: run it in the closed loop (--concurrency), not at a --rate"));
      }
    }
  }
  LoadReport report;
  report.address = client_.options().address;
  report.options = options_;
  report.options.progress = nullptr;
  report.mix = mix_;
  uint64_t seed = options_.seed;
  if (options_.rate > 0) {
    auto phase = std::make_shared<Phase>(client_, mix_, options_, seed);
    report.phases.push_back(phase->Open(options_.rate));
  } else {
    for (int concurrency : options_.concurrency) {
      auto phase = std::make_shared<Phase>(client_, mix_, options_, seed++);
      report.phases.push_back(phase->Closed(concurrency));
    }
  }
  return report;
}

Json LoadReportJson(const LoadReport& report) {
  const LoadOptions& o = report.options;
  Json json = Json::object();
  json["address"] = report.address;
  json["mode"] = o.rate > 0 ? "open" : "closed";
  json["arrivals"] =
      o.rate > 0 ? Json(o.arrivals == Arrivals::kPoisson ? "poisson" : "constant") : Json();
  json["max_outstanding"] = o.rate > 0 ? Json(o.max_outstanding) : Json();
  json["warmup_s"] = JsonDouble(absl::ToDoubleSeconds(o.warmup), 6);
  json["duration_s"] = o.requests > 0 ? Json() : JsonDouble(absl::ToDoubleSeconds(o.duration), 6);
  json["requests_per_phase"] = o.requests > 0 ? Json(o.requests) : Json();
  json["timeout_s"] = JsonDouble(absl::ToDoubleSeconds(o.timeout), 6);
  Json mix = Json::array();
  for (const RequestTemplate& t : report.mix) {
    Json entry = Json::object();
    entry["name"] = t.name;
    entry["weight"] = JsonDouble(t.weight, 6);
    entry["model"] = t.model;
    mix.push_back(std::move(entry));
  }
  json["mix"] = std::move(mix);
  Json phases = Json::array();
  for (const PhaseReport& p : report.phases) {
    Json phase = Json::object();
    phase["name"] = p.name;
    phase["concurrency"] = p.concurrency > 0 ? Json(p.concurrency) : Json();
    phase["rate"] = p.rate > 0 ? JsonDouble(p.rate, 6) : Json();
    phase["elapsed_s"] = JsonDouble(absl::ToDoubleSeconds(p.elapsed), 6);
    phase["requests"] = p.requests;
    phase["errors"] = p.errors();
    phase["skipped"] = p.skipped;
    phase["sequences_started"] = p.sequences_started;
    phase["sequences_completed"] = p.sequences_completed;
    phase["throughput_rps"] = JsonDouble(p.throughput(), 6);
    phase["latency_ms"] = LatencyJson(p.latency);
    phase["status_codes"] = CountsJson(p.status_codes);
    phase["outcomes"] = CountsJson(p.outcomes);
    Json by_outcome = Json::object();
    for (const auto& [outcome, h] : p.outcome_latency) by_outcome[outcome] = LatencyJson(h);
    phase["latency_ms_by_outcome"] = std::move(by_outcome);
    Json templates = Json::object();
    for (const auto& [name, counts] : p.templates) templates[name] = CountsJson(counts);
    phase["templates"] = std::move(templates);
    phases.push_back(std::move(phase));
  }
  json["phases"] = std::move(phases);
  return json;
}

void PrintLoadReport(const LoadReport& report, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {{"PHASE", "REQUESTS", "ERRORS", "SKIPPED", "REQ/S",
                                                 "P50 ms", "P90 ms", "P99 ms", "P99.9 ms",
                                                 "MAX ms"}};
  for (const PhaseReport& p : report.phases) {
    rows.push_back({p.name, absl::StrCat(p.requests), absl::StrCat(p.errors()),
                    absl::StrCat(p.skipped), absl::StrFormat("%.1f", p.throughput()),
                    Milliseconds(p.latency.Percentile(50)), Milliseconds(p.latency.Percentile(90)),
                    Milliseconds(p.latency.Percentile(99)),
                    Milliseconds(p.latency.Percentile(99.9)), Milliseconds(p.latency.max())});
  }
  PrintTable(out, rows, Align::kRight);
  if (std::any_of(report.phases.begin(), report.phases.end(),
                  [](const PhaseReport& p) { return p.sequences_started > 0; })) {
    rows = {{"PHASE", "SEQUENCES STARTED", "COMPLETED"}};
    for (const PhaseReport& p : report.phases) {
      rows.push_back({p.name, absl::StrCat(p.sequences_started),
                      absl::StrCat(p.sequences_completed)});
    }
    out << "\n";
    PrintTable(out, rows, Align::kRight);
  }
  // Outcome and status code tables: one column per phase.
  for (const bool by_outcome : {true, false}) {
    std::vector<std::string> keys;
    for (const PhaseReport& p : report.phases) {
      for (const auto& [key, n] : by_outcome ? p.outcomes : p.status_codes) {
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
      }
    }
    std::sort(keys.begin(), keys.end());
    rows = {{by_outcome ? "OUTCOME" : "STATUS CODE"}};
    for (const PhaseReport& p : report.phases) rows[0].push_back(p.name);
    if (by_outcome) rows[0].push_back("P50 ms / P99 ms (" + report.phases.back().name + ")");
    for (const std::string& key : keys) {
      std::vector<std::string> row = {key};
      for (const PhaseReport& p : report.phases) {
        const auto& counts = by_outcome ? p.outcomes : p.status_codes;
        auto it = counts.find(key);
        row.push_back(absl::StrCat(it == counts.end() ? 0 : it->second));
      }
      if (by_outcome) {
        const auto& latency = report.phases.back().outcome_latency;
        auto it = latency.find(key);
        row.push_back(it == latency.end()
                          ? "-"
                          : absl::StrCat(Milliseconds(it->second.Percentile(50)), " / ",
                                         Milliseconds(it->second.Percentile(99))));
      }
      rows.push_back(std::move(row));
    }
    out << "\n";
    PrintTable(out, rows, Align::kRight);
  }
}

bool IsLoopbackTarget(absl::string_view target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) return true;
  if (absl::ConsumePrefix(&target, "dns:")) {
    // dns:[//authority/]host[:port]: the authority names a DNS server.
    if (absl::ConsumePrefix(&target, "//")) {
      const size_t slash = target.find('/');
      if (slash == absl::string_view::npos) return false;
      if (slash > 0) return false;  // a remote resolver would be asked
      target.remove_prefix(slash + 1);
    }
  } else if (absl::ConsumePrefix(&target, "ipv4:") || absl::ConsumePrefix(&target, "ipv6:")) {
    // A comma-separated list: every address must be local.
    for (absl::string_view address : absl::StrSplit(target, ',')) {
      if (address.empty() || !IsLoopbackTarget(address)) return false;
    }
    return true;
  } else if (target.find("://") != absl::string_view::npos) {
    return false;  // another resolver scheme
  }
  absl::string_view host = target;
  if (absl::ConsumePrefix(&host, "[")) {
    const size_t close = host.find(']');
    if (close == absl::string_view::npos) return false;
    host = host.substr(0, close);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  const std::string lower = absl::AsciiStrToLower(host);
  if (lower == "localhost" || lower == "localhost.") return true;
  unsigned char bytes[16];
  if (inet_pton(AF_INET, lower.c_str(), bytes) == 1) return bytes[0] == 127;
  if (inet_pton(AF_INET6, lower.c_str(), bytes) == 1) {
    static constexpr unsigned char kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr unsigned char kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::equal(bytes, bytes + 16, kLoopback)) return true;
    return std::equal(bytes, bytes + 12, kMappedPrefix) && bytes[12] == 127;
  }
  return false;
}

}  // namespace precompile::client
