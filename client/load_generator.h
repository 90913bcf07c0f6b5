// A load generator for precompile-serve's KServe v2 ModelInfer, built on
// InferenceClient's asynchronous calls.
//
// Closed loop: for each concurrency level in turn, keeps that many requests
// outstanding (each completion sends the next). Open loop: sends at a target
// rate (Poisson or constant arrivals) whatever the responses do, but never
// more than max_outstanding at once; arrivals over that cap are counted as
// skipped, not queued. Latency is measured on the client's monotonic clock,
// from the send (closed loop) or from the scheduled arrival (open loop, so
// that a late send counts against the server rather than vanishing).
//
// Each phase runs `warmup` (not recorded) and then `duration`, or until
// `requests` recorded requests have been sent; it ends when they have all
// completed. Requests are drawn from a weighted mix (request_mix.h). A
// sequence template (closed loop only) holds its place in the loop for its
// whole sequence: each answer sends the sequence's next request, and after
// its last, or a request that failed, the loop draws again. A phase that
// ends mid-sequence leaves it to the server, which drops it once idle.
// Results are counted by gRPC status code, by outcome ("variant",
// "eager_fallback" from the response's precompile_outcome, or the error
// code's name) and by template, with latency histograms (latency_histogram.h)
// overall and per outcome.
//
// Thread safety: Run() from one thread at a time.
#ifndef PRECOMPILE_CLIENT_LOAD_GENERATOR_H_
#define PRECOMPILE_CLIENT_LOAD_GENERATOR_H_

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/inference_client.h"
#include "base/json_text.h"
#include "client/latency_histogram.h"
#include "client/request_mix.h"

namespace precompile::client {

enum class Arrivals { kPoisson, kConstant };

struct LoadOptions {
  // Closed loop: the concurrency of each phase, in order. Default: {1}.
  std::vector<int> concurrency = {1};
  // Open loop when > 0: target requests per second (one phase); then
  // `concurrency` is ignored. Default: 0.
  double rate = 0;
  Arrivals arrivals = Arrivals::kPoisson;
  // Open loop: the most requests outstanding at once. Default: 256.
  int max_outstanding = 256;
  // Unrecorded time at the start of each phase. Default: none.
  absl::Duration warmup = absl::ZeroDuration();
  // Recorded time per phase, unless `requests` > 0: then each phase records
  // that many requests instead. Default: 10 s.
  absl::Duration duration = absl::Seconds(10);
  int64_t requests = 0;
  // Deadline and attempts of each request. Defaults: 10 s, 1 (the load
  // generator reports UNAVAILABLE instead of hiding it behind retries).
  absl::Duration timeout = absl::Seconds(10);
  int max_attempts = 1;
  // Seeds template choice and Poisson arrivals. Default: 1.
  uint64_t seed = 1;
  // Where a progress line goes every `progress_interval`; null: nowhere.
  std::ostream* progress = nullptr;
  absl::Duration progress_interval = absl::Seconds(1);
};

struct PhaseReport {
  // "concurrency=8" or "rate=500/s".
  std::string name;
  int concurrency = 0;  // closed loop
  double rate = 0;      // open loop
  // From the end of the warmup to the last recorded completion.
  absl::Duration elapsed;
  // Recorded requests that completed (successfully or not).
  int64_t requests = 0;
  // Open loop: recorded arrivals not sent because max_outstanding were out.
  int64_t skipped = 0;
  // Sequences whose first request was recorded, and those whose last
  // request was recorded and succeeded.
  int64_t sequences_started = 0;
  int64_t sequences_completed = 0;
  LatencyHistogram latency;
  // "OK", "FAILED_PRECONDITION", ... -> count.
  std::map<std::string, int64_t> status_codes;
  // "variant", "eager_fallback", or an error code name -> count, latency.
  std::map<std::string, int64_t> outcomes;
  std::map<std::string, LatencyHistogram> outcome_latency;
  // Template name -> outcome -> count.
  std::map<std::string, std::map<std::string, int64_t>> templates;

  double throughput() const;  // recorded requests per second
  int64_t errors() const;     // requests whose status was not OK
};

struct LoadReport {
  std::string address;
  LoadOptions options;
  std::vector<RequestTemplate> mix;
  std::vector<PhaseReport> phases;
};

class LoadGenerator {
 public:
  // REQUIRES: `client` outlives the generator.
  LoadGenerator(InferenceClient& client, std::vector<RequestTemplate> mix, LoadOptions options);

  // Runs every phase in turn and returns what they measured.
  // INVALID_ARGUMENT for an empty mix or options out of range.
  absl::StatusOr<LoadReport> Run();

 private:
  InferenceClient& client_;
  const std::vector<RequestTemplate> mix_;
  const LoadOptions options_;
};

// The report as JSON (keys stable; latencies in milliseconds).
Json LoadReportJson(const LoadReport& report);

// The report as tables: one row per phase with throughput and latency
// percentiles, then counts by outcome and by status code.
void PrintLoadReport(const LoadReport& report, std::ostream& out);

// True when a gRPC target can only reach this machine: an address in
// 127.0.0.0/8, ::1 (or ::ffff:127.x.x.x), "localhost", or a unix socket.
// Host names other than localhost are not resolved, so they count as remote.
bool IsLoopbackTarget(absl::string_view target);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_LOAD_GENERATOR_H_
