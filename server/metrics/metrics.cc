#include "server/metrics/metrics.h"

#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <exception>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "server/http/http_transport.h"

namespace precompile::server {
namespace {

std::vector<absl::Duration> Seconds(std::initializer_list<double> bounds) {
  std::vector<absl::Duration> durations;
  for (double s : bounds) durations.push_back(absl::Seconds(s));
  return durations;
}

std::vector<absl::Duration> RequestBuckets() {
  return Seconds({0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                  0.1, 0.25, 0.5, 1, 2.5, 5, 10});
}

std::vector<absl::Duration> DispatchBuckets() {
  return Seconds({1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3});
}


}  // namespace

// GET /metrics: the collectables' series in Prometheus's text format,
// rendered on a worker (collecting reads the scheduler and /proc).
class MetricsHttpHandler final : public HttpHandler {
 public:
  explicit MetricsHttpHandler(std::vector<std::shared_ptr<prometheus::Collectable>> collectables)
      : collectables_(std::move(collectables)) {}

  std::optional<HttpAnswer> Screen(const HttpRequest& request) override {
    if (request.head.path != "/metrics") {
      return Refusal(404, absl::StrCat("this port serves /metrics only, not ",
                                       LoggedText(request.head.path, 256)));
    }
    if (request.head.method != "GET") {
      HttpAnswer answer = Refusal(405, "/metrics is read with GET or HEAD");
      answer.fields.emplace_back("Allow", "GET, HEAD");
      return answer;
    }
    return std::nullopt;
  }

  void Handle(HttpExchange& exchange) override {
    std::vector<prometheus::MetricFamily> families;
    for (const auto& collectable : collectables_) {
      std::vector<prometheus::MetricFamily> collected = collectable->Collect();
      families.insert(families.end(), std::make_move_iterator(collected.begin()),
                      std::make_move_iterator(collected.end()));
    }
    HttpAnswer answer;
    answer.content_type = "text/plain; version=0.0.4; charset=utf-8";
    answer.body = prometheus::TextSerializer().Serialize(families);
    exchange.Answer(std::move(answer));
  }

  HttpAnswer Refusal(int status, absl::string_view message) override {
    HttpAnswer answer;
    answer.status = status;
    answer.content_type = "text/plain; charset=utf-8";
    answer.body = absl::StrCat(message, "\n");
    return answer;
  }

 private:
  const std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
};

// Gauges read when Prometheus scrapes: the server's load and the
// process's memory (the names and meanings of Prometheus's client libraries,
// so that dashboards made for other servers read them).
// Per model that keeps sequences' state (sequence_batching).
void AddSequences(const std::vector<SequenceLoad>& sequences,
                  std::vector<prometheus::MetricFamily>& families) {
  if (sequences.empty()) return;
  prometheus::MetricFamily active{"precompile_sequences_active",
                                  "Sequences whose state the server holds, by model",
                                  prometheus::MetricType::Gauge, {}};
  prometheus::MetricFamily bytes{"precompile_sequence_state_bytes",
                                 "Bytes of the sequences' state tensors the server holds, by model",
                                 prometheus::MetricType::Gauge, {}};
  prometheus::MetricFamily gone{
      "precompile_sequences_gone_total",
      "Sequences whose state the server dropped, by model and reason: ended (sequence_end or "
      "a new sequence_start), expired (idle past max_sequence_idle_microseconds), evicted "
      "(to keep within --sequence_state_bytes)",
      prometheus::MetricType::Counter, {}};
  for (const SequenceLoad& s : sequences) {
    const prometheus::ClientMetric::Label model{"model", s.model};
    active.metric.emplace_back();
    active.metric.back().label = {model};
    active.metric.back().gauge.value = static_cast<double>(s.active);
    bytes.metric.emplace_back();
    bytes.metric.back().label = {model};
    bytes.metric.back().gauge.value = static_cast<double>(s.state_bytes);
    for (const auto& [reason, count] : {std::pair<const char*, uint64_t>{"ended", s.ended},
                                        {"expired", s.expired},
                                        {"evicted", s.evicted}}) {
      gone.metric.emplace_back();
      gone.metric.back().label = {model, {"reason", reason}};
      gone.metric.back().counter.value = static_cast<double>(count);
    }
  }
  families.push_back(std::move(active));
  families.push_back(std::move(bytes));
  families.push_back(std::move(gone));
}

class LoadCollectable final : public prometheus::Collectable {
 public:
  LoadCollectable() : start_seconds_(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())) {}

  void SetProbe(std::function<ServerLoad()> probe) { probe_ = std::move(probe); }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    auto gauge = [&](const char* name, const char* help, double value) {
      prometheus::MetricFamily family{name, help, prometheus::MetricType::Gauge, {}};
      family.metric.emplace_back();
      family.metric.back().gauge.value = value;
      families.push_back(std::move(family));
    };
    if (probe_) {
      const ServerLoad load = probe_();
      gauge("precompile_draining",
            "1 once the server has begun to drain (SIGTERM): it finishes what is in flight "
            "and admits nothing new",
            load.draining ? 1 : 0);
      gauge("precompile_inference_in_flight",
            "Inference requests admitted and not finished (running or queued)", load.in_flight);
      gauge("precompile_inference_queued", "Inference requests admitted and waiting for a run slot",
            load.queued);
      gauge("precompile_eager_queued",
            "Eager misses waiting for an eager thread (--eager_threads); they hold no run slot",
            load.eager_queued);
      gauge("precompile_batch_waiting",
            "Inference requests waiting in an open batch (dynamic_batching); they hold no "
            "run slot", load.batch_waiting);
      gauge("precompile_inference_run_slots", "Inference requests that run at once "
            "(--inference_threads)", load.run_slots);
      gauge("precompile_inference_max_in_flight",
            "Inference requests admitted at once before RESOURCE_EXHAUSTED "
            "(--max_concurrent_requests; 0: no limit)", load.max_in_flight);
      gauge("precompile_inference_in_flight_bytes",
            "Bytes of the inference requests admitted and not finished", load.in_flight_bytes);
      gauge("precompile_inference_max_in_flight_bytes",
            "Bytes of inference requests admitted at once before RESOURCE_EXHAUSTED "
            "(--max_in_flight_request_bytes; 0: no limit)", load.max_in_flight_bytes);
      gauge("precompile_grpc_unsent_answer_bytes",
            "Bytes of gRPC answers their clients have not taken whole yet; at "
            "--grpc_unsent_answer_bytes new inference calls are refused",
            load.grpc_unsent_answer_bytes);
      gauge("precompile_sequence_state_max_bytes",
            "Bytes of sequences' state the server may hold (--sequence_state_bytes); past it "
            "the sequence idle longest is evicted",
            static_cast<double>(load.max_sequence_state_bytes));
      AddSequences(load.sequences, families);
      gauge("precompile_inference_memory_bytes",
            "Bytes of CPU tensors that model calls allocated and that are still held (their "
            "buffers, outputs not sent yet, sequences' state)",
            static_cast<double>(load.inference_memory_bytes));
      gauge("precompile_inference_max_memory_bytes",
            "Bytes of CPU tensors model calls may hold at once (--max_inference_memory_bytes; "
            "0: no limit); a call that would pass it gets RESOURCE_EXHAUSTED",
            static_cast<double>(load.max_inference_memory_bytes));
      prometheus::MetricFamily refused{
          "precompile_inference_memory_refusals_total",
          "Tensor allocations of model calls refused at --max_inference_memory_bytes (each "
          "ends its call with RESOURCE_EXHAUSTED)",
          prometheus::MetricType::Counter, {}};
      refused.metric.emplace_back();
      refused.metric.back().counter.value = static_cast<double>(load.inference_memory_refusals);
      families.push_back(std::move(refused));
      prometheus::MetricFamily closed{
          "precompile_grpc_connections_closed_total",
          "gRPC connections the server closed: `resets` for cancelling calls faster than "
          "--grpc_max_resets_per_second (HTTP/2's rapid reset), `streams` for opening far "
          "more streams than allowed or holding the most past --grpc_max_open_streams, "
          "`capacity` the new one or the one idle longest at "
          "--grpc_max_connections",
          prometheus::MetricType::Counter, {}};
      for (const auto& [reason, count] :
           {std::pair{"resets", load.grpc_closed_for_resets},
            std::pair{"streams", load.grpc_closed_for_streams},
            std::pair{"capacity", load.grpc_refused_connections}}) {
        closed.metric.emplace_back();
        closed.metric.back().label.push_back({"reason", reason});
        closed.metric.back().counter.value = static_cast<double>(count);
      }
      families.push_back(std::move(closed));
    }
    // /proc/self/statm: the virtual and the resident size, in pages.
    std::ifstream statm("/proc/self/statm");
    double pages_virtual = 0, pages_resident = 0;
    if (statm >> pages_virtual >> pages_resident) {
      const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
      gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
            pages_resident * page);
      gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", pages_virtual * page);
    }
    gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
          start_seconds_);
    return families;
  }

 private:
  const double start_seconds_;
  std::function<ServerLoad()> probe_;
};

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(prometheus::BuildCounter()
                    .Name("precompile_requests_total")
                    .Help("Inference requests by model version and outcome")
                    .Register(*registry_)),
      unknown_model_requests_(prometheus::BuildCounter()
                                  .Name("precompile_unknown_model_requests_total")
                                  .Help("Inference requests for a model the server does not serve")
                                  .Register(*registry_)),
      frame_calls_(prometheus::BuildCounter()
                       .Name("precompile_frame_calls_total")
                       .Help("Frame calls by model version, frame and outcome "
                             "(variant, eager_fallback, refused, error)")
                       .Register(*registry_)),
      variant_hits_(prometheus::BuildCounter()
                        .Name("precompile_variant_hits_total")
                        .Help("Calls served by each compiled variant")
                        .Register(*registry_)),
      eager_fallback_warnings_(
          prometheus::BuildCounter()
              .Name("precompile_eager_fallback_warnings_total")
              .Help("Eager-fallback warnings issued (one per flagged frame that "
                    "missed its variants)")
              .Register(*registry_)),
      miss_signatures_(prometheus::BuildGauge()
                           .Name("precompile_miss_signatures")
                           .Help("Distinct signatures of calls no variant matched, kept per "
                                 "frame (bounded by --miss_signatures_per_frame; the admin "
                                 "RPC Misses lists them)")
                           .Register(*registry_)),
      summary_complete_(prometheus::BuildGauge()
                            .Name("precompile_model_complete")
                            .Help("1 if the artifact's capture is complete")
                            .Register(*registry_)),
      summary_uncovered_(prometheus::BuildGauge()
                             .Name("precompile_model_uncovered_frames")
                             .Help("Frames the capture left without a variant")
                             .Register(*registry_)),
      summary_flagged_(prometheus::BuildGauge()
                           .Name("precompile_model_eager_fallback_frames")
                           .Help("Frames flagged eager_fallback")
                           .Register(*registry_)),
      summary_variants_(prometheus::BuildGauge()
                            .Name("precompile_model_variants")
                            .Help("Compiled variants in the artifact")
                            .Register(*registry_)),
      summary_truncated_(prometheus::BuildGauge()
                             .Name("precompile_model_truncated")
                             .Help("1 if the capture hit its recompile limit")
                             .Register(*registry_)),
      models_loaded_(prometheus::BuildGauge()
                         .Name("precompile_models_loaded")
                         .Help("Models being served")
                         .Register(*registry_)),
      model_ready_(prometheus::BuildGauge()
                       .Name("precompile_model_ready")
                       .Help("1 while a model of the repository is served; 0 while it loads, "
                             "unloads or after its load failed")
                       .Register(*registry_)),
      load_(std::make_shared<LoadCollectable>()),
      load_failures_(prometheus::BuildCounter()
                         .Name("precompile_model_load_failures_total")
                         .Help("Model loads that failed, by model")
                         .Register(*registry_)),
      batch_rows_(prometheus::BuildHistogram()
                      .Name("precompile_batch_rows")
                      .Help("Rows per run of a model: one request's, or a merged batch's "
                            "(dynamic_batching in the model's config.pbtxt)")
                      .Register(*registry_)),
      request_duration_(std::make_shared<DurationHistogramFamily>(
          "precompile_request_duration_seconds",
          "Inference request time in the server, decode to encode", RequestBuckets())),
      dispatch_duration_(std::make_shared<DurationHistogramFamily>(
          "precompile_guard_dispatch_duration_seconds", "Guard evaluation time per frame call",
          DispatchBuckets())),
      execution_duration_(std::make_shared<DurationHistogramFamily>(
          "precompile_execution_duration_seconds",
          "Variant or eager program run time per frame call", RequestBuckets())),
      loaded_gauge_(models_loaded_.Add({})) {}

ServerMetrics::~ServerMetrics() {
  // No scrape may read the series while they go.
  if (http_ != nullptr) http_->Stop(absl::Now());
}

absl::Status ServerMetrics::StartHttp(const std::string& address) {
  http_handler_ =
      std::make_unique<MetricsHttpHandler>(std::vector<std::shared_ptr<prometheus::Collectable>>{
          registry_, load_, request_duration_, dispatch_duration_, execution_duration_});
  HttpTransportOptions options;
  options.address = address;
  // Prometheus scrapes one request at a time per target; a client that
  // sends slowly or not at all holds a connection, not a worker.
  options.workers = 2;
  options.max_connections = 64;
  options.max_head_bytes = 8 << 10;
  options.max_body_bytes = 0;
  options.max_body_flag = "/metrics takes no body";
  // Answers a client does not read: a scrape's text is KiBs to a few MiB.
  options.max_body_buffer_bytes = 64 << 20;
  options.request_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<HttpTransport>> started =
      HttpTransport::Start(options, *http_handler_);
  if (!started.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", started.status().message()));
  }
  http_ = *std::move(started);
  return absl::OkStatus();
}

int ServerMetrics::http_port() const { return http_ == nullptr ? 0 : http_->port(); }

std::shared_ptr<ModelMetrics> ServerMetrics::ForModel(const std::string& model,
                                                      int64_t version,
                                                      const LoadedVersion& loaded) {
  std::lock_guard<std::mutex> lock(mu_);
  std::weak_ptr<ModelMetrics>& slot = model_metrics_[{model, version}];
  if (std::shared_ptr<ModelMetrics> live = slot.lock()) return live;
  auto metrics = std::make_shared<ModelMetrics>(*this, model, version, loaded);
  slot = metrics;
  return metrics;
}

void ServerMetrics::ExportServerLoad(std::function<ServerLoad()> probe) {
  load_->SetProbe(std::move(probe));
}

void ServerMetrics::OnModelState(const ModelState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  // Unavailable without a failure: the repository no longer has it.
  const bool gone = state.phase == ModelState::Phase::kUnavailable && !state.failed;
  auto it = model_ready_gauges_.find(state.name);
  if (gone) {
    if (it != model_ready_gauges_.end()) {
      model_ready_.Remove(it->second);
      model_ready_gauges_.erase(it);
    }
  } else {
    if (it == model_ready_gauges_.end()) {
      it = model_ready_gauges_.emplace(state.name, &model_ready_.Add({{"model", state.name}}))
               .first;
    }
    it->second->Set(state.phase == ModelState::Phase::kReady ? 1 : 0);
  }
  int loaded = 0;
  for (const auto& [name, gauge] : model_ready_gauges_) loaded += gauge->Value() == 1;
  loaded_gauge_.Set(loaded);
}

void ServerMetrics::OnLoadFailure(const std::string& model) {
  load_failures_.Add({{"model", model}}).Increment();
}

void ServerMetrics::RecordUnknownModelRequest() {
  unknown_model_requests_.Add({}).Increment();
}

ModelMetrics::ModelMetrics(ServerMetrics& server, const std::string& model,
                           int64_t version, const LoadedVersion& loaded)
    : server_(server) {
  const std::string v = absl::StrCat(version);
  for (int o = 0; o < kNumRequestOutcomes; ++o) {
    requests_[o] = &server.requests_.Add(
        {{"model", model},
         {"version", v},
         {"outcome", RequestOutcomeName(static_cast<RequestOutcome>(o))}});
  }
  request_duration_ = &server.request_duration_->Add({{"model", model}, {"version", v}});
  batch_rows_ = &server.batch_rows_.Add(
      {{"model", model}, {"version", v}},
      prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024});
  for (const auto& frame : loaded.manifest().frames()) {
    FrameSeries series;
    series.name = frame.name();
    for (int o = 0; o < 4; ++o) {
      series.calls[o] = &server.frame_calls_.Add(
          {{"model", model},
           {"version", v},
           {"frame", frame.name()},
           {"outcome", std::string(OutcomeName(static_cast<Outcome>(o)))}});
    }
    series.warnings = &server.eager_fallback_warnings_.Add(
        {{"model", model}, {"version", v}, {"frame", frame.name()}});
    series.dispatch = &server.dispatch_duration_->Add(
        {{"model", model}, {"version", v}, {"frame", frame.name()}});
    series.execution = &server.execution_duration_->Add(
        {{"model", model}, {"version", v}, {"frame", frame.name()}});
    series.miss_signatures =
        &server.miss_signatures_.Add({{"model", model}, {"version", v}, {"frame", frame.name()}});
    for (const auto& variant : frame.variants()) {
      series.variant_hits.push_back(&server.variant_hits_.Add({{"model", model},
                                                               {"version", v},
                                                               {"frame", frame.name()},
                                                               {"variant", variant.id()}}));
    }
    frames_.push_back(std::move(series));
  }
  const auto& summary = loaded.manifest().summary();
  int variants = 0;
  for (const auto& frame : loaded.manifest().frames()) variants += frame.variants_size();
  const prometheus::Labels labels{{"model", model}, {"version", v}};
  auto gauge = [&](prometheus::Family<prometheus::Gauge>& family, double value) {
    prometheus::Gauge& g = family.Add(labels);
    g.Set(value);
    gauges_.emplace_back(&family, &g);
  };
  gauge(server.summary_complete_, summary.complete() ? 1 : 0);
  gauge(server.summary_uncovered_, summary.uncovered_frames_size());
  gauge(server.summary_flagged_, summary.eager_fallbacks_size());
  gauge(server.summary_variants_, variants);
  gauge(server.summary_truncated_, summary.truncated() ? 1 : 0);
}

ModelMetrics::~ModelMetrics() {
  for (prometheus::Counter* c : requests_) server_.requests_.Remove(c);
  server_.request_duration_->Remove(request_duration_);
  server_.batch_rows_.Remove(batch_rows_);
  for (FrameSeries& f : frames_) {
    for (prometheus::Counter* c : f.calls) server_.frame_calls_.Remove(c);
    server_.eager_fallback_warnings_.Remove(f.warnings);
    server_.dispatch_duration_->Remove(f.dispatch);
    server_.execution_duration_->Remove(f.execution);
    server_.miss_signatures_.Remove(f.miss_signatures);
    for (prometheus::Counter* c : f.variant_hits) server_.variant_hits_.Remove(c);
  }
  for (auto [family, gauge] : gauges_) family->Remove(gauge);
}

void ModelMetrics::OnFrameCall(const FrameCallEvent& event) {
  if (event.frame_index < 0 || event.frame_index >= static_cast<int>(frames_.size())) {
    return;
  }
  FrameSeries& f = frames_[event.frame_index];
  f.calls[static_cast<int>(event.outcome)]->Increment();
  if (event.variant_index >= 0 &&
      event.variant_index < static_cast<int>(f.variant_hits.size())) {
    f.variant_hits[event.variant_index]->Increment();
  }
  f.dispatch->Observe(event.dispatch_time);
  if (event.miss_signatures > 0) {
    f.miss_signatures->Set(static_cast<double>(event.miss_signatures));
  }
  if (event.outcome == Outcome::kVariant || event.outcome == Outcome::kEagerFallback) {
    f.execution->Observe(event.run_time);
  }
}

void ModelMetrics::OnEagerFallbackWarning(absl::string_view, absl::string_view frame,
                                          absl::string_view) {
  for (FrameSeries& f : frames_) {
    if (f.name == frame) f.warnings->Increment();
  }
}

void ModelMetrics::RecordRequest(RequestOutcome outcome, const RequestTiming& timing) {
  requests_[static_cast<int>(outcome)]->Increment();
  request_duration_->Observe(timing.total);
  const bool success =
      outcome == RequestOutcome::kVariant || outcome == RequestOutcome::kEagerFallback;
  (success ? success_ : fail_).Add(timing.total);
  if (success) {
    inferences_.fetch_add(static_cast<uint64_t>(timing.inferences), std::memory_order_relaxed);
    queue_.Add(timing.queue);
    input_.Add(timing.input);
    infer_.Add(timing.infer);
    output_.Add(timing.output);
  }
  last_inference_ms_.store(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())),
                           std::memory_order_relaxed);
}

void ModelMetrics::RecordExecution(int64_t rows) {
  executions_.fetch_add(1, std::memory_order_relaxed);
  batch_rows_->Observe(static_cast<double>(rows));
}

InferStatistics ModelMetrics::Statistics() const {
  auto get = [](const AtomicDuration& d, uint64_t& count, uint64_t& ns) {
    count = d.count.load(std::memory_order_relaxed);
    ns = d.ns.load(std::memory_order_relaxed);
  };
  InferStatistics s;
  get(success_, s.success_count, s.success_ns);
  get(fail_, s.fail_count, s.fail_ns);
  get(queue_, s.queue_count, s.queue_ns);
  get(input_, s.input_count, s.input_ns);
  get(infer_, s.infer_count, s.infer_ns);
  get(output_, s.output_count, s.output_ns);
  s.last_inference_ms = last_inference_ms_.load(std::memory_order_relaxed);
  s.inference_count = inferences_.load(std::memory_order_relaxed);
  s.execution_count = executions_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace precompile::server
