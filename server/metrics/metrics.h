// Prometheus metrics of the server, exported over HTTP at /metrics.
//
// Per model version: requests and frame calls by outcome (variant,
// eager_fallback, refused, error), variant hits, eager-fallback warnings by
// frame, distinct miss signatures by frame, the capture's summary as gauges (complete, uncovered and flagged
// frames, variants), and latency histograms for the whole request, guard
// dispatch and execution. Server-wide: loaded models, each model's readiness
// and load failures, the request scheduler's load (in flight, queued, run
// slots, the admission limit), whether it drains, the sequences' state it
// holds (active sequences, their bytes, those gone by why, per model), and
// the process's memory.
//
// A ModelMetrics owns the series of one model version; they disappear when
// it is destroyed, which happens when the last request using that version
// is done (the LoadedVersion holds it as its observer).
//
// Thread safety: all methods may be called concurrently. The per-call path
// takes no lock shared by all requests: each series is looked up once, when
// the model version is loaded.
#ifndef PRECOMPILE_SERVER_METRICS_METRICS_H_
#define PRECOMPILE_SERVER_METRICS_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/loaded_version.h"
#include "runtime/observer.h"
#include "server/metrics/duration_histogram.h"
#include "server/repository/model_recorder.h"
#include "server/repository/model_state.h"

namespace precompile::server {

class ServerMetrics;
class LoadCollectable;

// The sequences of one model that keeps their state (sequence_batching).
struct SequenceLoad {
  std::string model;
  int64_t active = 0;
  int64_t state_bytes = 0;
  // Sequences gone since the server started, by why.
  uint64_t ended = 0;
  uint64_t expired = 0;
  uint64_t evicted = 0;
};

// What the request scheduler holds, and whether the server drains, read at
// each scrape.
struct ServerLoad {
  bool draining = false;
  int in_flight = 0;
  int queued = 0;
  int eager_queued = 0;
  int batch_waiting = 0;
  int run_slots = 0;
  int max_in_flight = 0;  // 0: no limit.
  int64_t in_flight_bytes = 0;
  int64_t max_in_flight_bytes = 0;  // 0: no limit.
  // Answers handed to gRPC that their clients have not taken whole.
  int64_t grpc_unsent_answer_bytes = 0;
  // The sequences' state the server holds, by model, and its budget.
  std::vector<SequenceLoad> sequences;
  int64_t max_sequence_state_bytes = 0;
  // CPU tensors that model calls hold (runtime/inference_memory.h), their
  // bound (0: none) and the allocations refused for it.
  uint64_t inference_memory_bytes = 0;
  uint64_t max_inference_memory_bytes = 0;
  uint64_t inference_memory_refusals = 0;
  // gRPC connections the front (server/grpc/http2_front.h) closed for
  // passing a limit, or refused for their number.
  uint64_t grpc_closed_for_resets = 0;
  uint64_t grpc_closed_for_streams = 0;
  uint64_t grpc_refused_connections = 0;
};

class ModelMetrics final : public ModelRecorder {
 public:
  ModelMetrics(ServerMetrics& server, const std::string& model, int64_t version,
               const LoadedVersion& loaded);
  ~ModelMetrics() override;

  void OnFrameCall(const FrameCallEvent& event) override;
  void OnEagerFallbackWarning(absl::string_view model, absl::string_view frame,
                              absl::string_view message) override;

  void RecordRequest(RequestOutcome outcome, const RequestTiming& timing) override;
  void RecordExecution(int64_t rows) override;
  InferStatistics Statistics() const override;

 private:
  struct FrameSeries {
    std::string name;
    std::array<prometheus::Counter*, 4> calls{};  // Indexed by Outcome.
    prometheus::Counter* warnings = nullptr;
    DurationHistogram* dispatch = nullptr;
    DurationHistogram* execution = nullptr;
    prometheus::Gauge* miss_signatures = nullptr;
    std::vector<prometheus::Counter*> variant_hits;
  };

  struct AtomicDuration {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> ns{0};
    void Add(absl::Duration d) {
      count.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(static_cast<uint64_t>(absl::ToInt64Nanoseconds(d)),
                   std::memory_order_relaxed);
    }
  };

  ServerMetrics& server_;
  AtomicDuration success_, fail_, queue_, input_, infer_, output_;
  std::atomic<uint64_t> last_inference_ms_{0};
  std::atomic<uint64_t> inferences_{0};
  std::atomic<uint64_t> executions_{0};
  prometheus::Histogram* batch_rows_ = nullptr;
  std::array<prometheus::Counter*, kNumRequestOutcomes> requests_{};
  DurationHistogram* request_duration_ = nullptr;
  std::vector<FrameSeries> frames_;
  // The summary gauges, each with the family it belongs to.
  std::vector<std::pair<prometheus::Family<prometheus::Gauge>*, prometheus::Gauge*>> gauges_;
};

class HttpTransport;
class MetricsHttpHandler;

class ServerMetrics {
 public:
  ServerMetrics();
  ~ServerMetrics();

  // Serves /metrics at `address` ("host:port"; port 0 picks a free one),
  // over the server's own HTTP transport (server/http/http_transport.h): a
  // client that sends slowly, half a request or nothing holds no thread, so
  // none keeps Prometheus out. UNAVAILABLE if it cannot listen there.
  absl::Status StartHttp(const std::string& address);
  // The port /metrics listens on; 0 before StartHttp.
  int http_port() const;

  // The metrics of a model version. A version loaded again while its
  // previous load is still referenced continues the same series (Prometheus
  // series are identified by their labels, so two owners could not coexist).
  std::shared_ptr<ModelMetrics> ForModel(const std::string& model, int64_t version,
                                         const LoadedVersion& loaded);
  // Exports the server's load as gauges, read from `probe` at each scrape.
  // REQUIRES: called once, before StartHttp; whatever `probe` reads
  // outlives this object.
  void ExportServerLoad(std::function<ServerLoad()> probe);
  // Tracks the models being served: precompile_model_ready is 1 for a model
  // being served, 0 for one loading, unloading or whose load failed, and
  // absent for one the repository no longer has.
  void OnModelState(const ModelState& state);
  void OnLoadFailure(const std::string& model);
  // A request for a model the server does not know.
  void RecordUnknownModelRequest();

  prometheus::Registry& registry() { return *registry_; }

 private:
  friend class ModelMetrics;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Counter>& unknown_model_requests_;
  prometheus::Family<prometheus::Counter>& frame_calls_;
  prometheus::Family<prometheus::Counter>& variant_hits_;
  prometheus::Family<prometheus::Counter>& eager_fallback_warnings_;
  prometheus::Family<prometheus::Gauge>& miss_signatures_;
  prometheus::Family<prometheus::Gauge>& summary_complete_;
  prometheus::Family<prometheus::Gauge>& summary_uncovered_;
  prometheus::Family<prometheus::Gauge>& summary_flagged_;
  prometheus::Family<prometheus::Gauge>& summary_variants_;
  prometheus::Family<prometheus::Gauge>& summary_truncated_;
  prometheus::Family<prometheus::Gauge>& models_loaded_;
  prometheus::Family<prometheus::Gauge>& model_ready_;
  // The scheduler's load and the process's memory, read at each scrape.
  std::shared_ptr<LoadCollectable> load_;
  prometheus::Family<prometheus::Counter>& load_failures_;
  prometheus::Family<prometheus::Histogram>& batch_rows_;
  // Observed by every request, so not prometheus-cpp's (a mutex per series).
  const std::shared_ptr<DurationHistogramFamily> request_duration_;
  const std::shared_ptr<DurationHistogramFamily> dispatch_duration_;
  const std::shared_ptr<DurationHistogramFamily> execution_duration_;
  prometheus::Gauge& loaded_gauge_;
  // What answers /metrics, and the transport it answers on (which must go
  // first).
  std::unique_ptr<MetricsHttpHandler> http_handler_;
  std::unique_ptr<HttpTransport> http_;
  std::mutex mu_;
  // precompile_model_ready of each model the repository has; the models
  // loaded are those whose gauge is 1.
  absl::flat_hash_map<std::string, prometheus::Gauge*> model_ready_gauges_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::pair<std::string, int64_t>, std::weak_ptr<ModelMetrics>>
      model_metrics_ ABSL_GUARDED_BY(mu_);
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_METRICS_METRICS_H_
