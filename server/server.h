// The precompile-serve server: gRPC services (KServe v2 inference, the
// precompile admin API, grpc.health.v1 and reflection) and KServe v2 over
// HTTP/REST, over a model repository, and Prometheus metrics over HTTP.
//
// Lifecycle: Start() listens first (live, not ready: health NOT_SERVING),
// loads the repository, then turns ready. BeginDrain() turns health and
// ServerReady to NOT_SERVING at once while everything keeps serving; Stop()
// stops accepting calls, lets running ones finish within the drain timeout,
// and says what was still running if they did not.
//
// Thread safety: Start/BeginDrain/Stop from one controlling thread; the
// accessors from any thread.
#ifndef PRECOMPILE_SERVER_SERVER_H_
#define PRECOMPILE_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/notification.h"
#include "base/tls_server.h"
#include "server/api/inference_api.h"
#include "server/api/request_trace.h"
#include "server/api/serving_state.h"
#include "server/grpc/admin_service.h"
#include "server/grpc/health_service.h"
#include "server/grpc/http2_front.h"
#include "server/grpc/inference_service.h"
#include "server/grpc/reflection_service.h"
#include "server/grpc/unary_call_router.h"
#include "server/http/http_service.h"
#include "server/metrics/metrics.h"
#include "server/repository/model_repository.h"
#include "server/scheduling/request_scheduler.h"

namespace precompile::server {

struct ServerOptions {
  // REQUIRES: a directory. Models are its subdirectories.
  std::string model_repository;
  // Where gRPC listens; port 0 picks a free port (see grpc_port()).
  std::string grpc_address = "0.0.0.0:8001";
  // Where /metrics listens; empty disables it.
  std::string metrics_address = "0.0.0.0:8002";
  // Where KServe v2 HTTP/REST listens (server/http/http_service.h): host:port or
  // [host]:port; port 0 picks a free port (see http_port()). Empty (the
  // default here; the server binary's is port 8000) disables it.
  std::string http_address;
  // Threads handling HTTP requests once they have arrived whole (a
  // connection holds none while it sends or idles). Default: 64.
  int http_threads = 64;
  // HTTP connections open at once; past it, the one idle longest is closed.
  int http_max_connections = 1024;
  // Bytes of HTTP request bodies held at once, arriving or being answered;
  // a request that would pass it is refused (429) before its body is read.
  int64_t http_max_body_buffer_bytes = int64_t{1} << 30;
  // An HTTP request must arrive whole within this (plus a second per MiB of
  // body); a client idle this long between requests loses its connection.
  absl::Duration http_request_timeout = absl::Seconds(30);
  // Largest request or response message. Default: 256 MiB.
  int max_message_bytes = 256 << 20;
  // Inference requests admitted at once, running or queued; more get
  // RESOURCE_EXHAUSTED. 0: no limit. Default: 128.
  int max_concurrent_requests = 128;
  // Bytes of the inference requests admitted at once (their messages or
  // bodies); a request that would pass it gets RESOURCE_EXHAUSTED. 0: no
  // limit. Default: 1 GiB.
  int64_t max_in_flight_request_bytes = int64_t{1} << 30;
  // Threads running inference requests (model calls); more requests wait in
  // a queue, up to max_concurrent_requests in all. 0: one per core this
  // process may use (base/usable_cores.h: affinity and cgroup CPU quota).
  int inference_threads = 0;
  // Threads taking inference requests from gRPC; each runs the request it
  // took while fewer than inference_threads run. More than
  // inference_threads, so that some are free to take and refuse calls.
  // 0: 2 * inference_threads + 2 (measured: with one spare thread, a thread
  // woke for nearly every request; see bench/RESULTS.md).
  int inference_pollers = 0;
  // Threads running entry frames' eager programs (eager misses), with their
  // nice value raised by eager_nice so that variant hits go first when the
  // cores are busy (server/scheduling/request_scheduler.h). 0: one per inference thread.
  int eager_threads = 0;
  // 0 to 19; 0 runs eager misses at the priority of the other requests.
  int eager_nice = 10;
  // Memory gRPC may take for what it is receiving and sending (its
  // ResourceQuota): messages arrive whole before anything here sees them,
  // so without it many connections sending large messages slowly hold
  // their sum. Near it, gRPC stops granting its senders flow-control
  // window. 0: no limit. Default: 1 GiB.
  int64_t grpc_memory_bytes = int64_t{1} << 30;
  // A fixed flow-control window per gRPC stream. gRPC's adaptive one (BDP
  // probing) grants each connection many MiB before grpc_memory_bytes
  // takes effect: 48 connections sending 30 MiB messages slowly grew the
  // peak by 450 to 530 MiB with a 64 MiB quota, by 91 MiB with a 1 MiB
  // window (tests/hostile). A window bounds a stream's throughput to about
  // window / round trip: 1 MiB is 10 GB/s at a cluster's 0.1 ms, 20 MB/s
  // at 50 ms. 0: gRPC's adaptive window. Default: 1 MiB.
  int grpc_window_bytes = 1 << 20;
  // What gRPC answers not yet taken by their clients may hold, in bytes and
  // in time (server/grpc/inference_service.h). Default: 1 GiB, 60 s.
  AnswerLimits grpc_answers = {int64_t{1} << 30, absl::Seconds(60)};
  // Request traces (server/api/request_trace.h): the file they go to (empty:
  // none, and tracing cannot be turned on) and the server's settings at
  // start; TraceSetting changes them at run time.
  std::string trace_file;
  TraceConfig trace;
  // Streams one gRPC connection may have open at once (HTTP/2's
  // SETTINGS_MAX_CONCURRENT_STREAMS; clients queue further calls). gRPC's
  // default is unlimited, and each stream, even one that never sends its
  // message, holds about 17 KiB outside grpc_memory_bytes: one connection
  // opening 50000 grew the server by 880 MiB (tests/hostile). 0: gRPC's
  // default. Default: 100, as HTTP/2 suggests at the least.
  int grpc_max_streams_per_connection = 100;
  // Plain gRPC connections go through the server's own front
  // (server/grpc/http2_front.h), which keeps the limits gRPC 1.51 does not:
  // rapid resets, streams past the limit before the client acknowledges
  // it, connections. With TLS, gRPC takes its connections itself.
  bool grpc_front = true;
  // gRPC connections open at once, through the front; past it a new one
  // takes the place of the one idle longest (none open: it is closed).
  // Default: 1024.
  int grpc_max_connections = 1024;
  // Streams open on all gRPC connections together, through the front; past
  // it the connection holding the most is closed. Each connection within
  // its own limits can still hold hundreds of streams: 200 connections
  // holding 400 each grew the server by 982 MiB. 0: no limit. Default:
  // 4096, 32 times the default --max_concurrent_requests.
  int grpc_max_open_streams = 4096;
  // Threads relaying gRPC connections through the front (one moves about
  // 3 GB/s: large requests on a many-core machine need several).
  int grpc_relay_threads = 1;
  // Calls one gRPC connection may cancel before their answers each second,
  // with a burst of twice as many; past it the front closes the
  // connection. 0: no limit. Default: 100.
  int grpc_max_resets_per_second = 100;
  // Threads serving the gRPC methods other than ModelInfer, health and
  // reflection (server/grpc/unary_call_router.h); each runs one call at a
  // time to its end. Default: 4.
  int grpc_unary_threads = 4;
  // Bytes of sequences' state (models whose config.pbtxt has
  // sequence_batching) the server holds at once; past it the sequence idle
  // longest is evicted (server/scheduling/sequence_state.h). Default: 1 GiB.
  int64_t sequence_state_bytes = int64_t{1} << 30;
  // The most one client's sequences hold (one client certificate, or all
  // clients without one); past it that client's own sequence idle longest
  // is evicted. Default: 0, no share.
  int64_t sequence_state_bytes_per_client = 0;
  // Bytes of CPU tensors that model calls hold at once: their intermediate
  // buffers, outputs and what eager programs allocate
  // (runtime/inference_memory.h). A call whose allocation would pass it
  // gets RESOURCE_EXHAUSTED. Process-wide. 0: no limit (libtorch's own
  // allocator, nothing counted, unless another server of the process set
  // one). Default: 4 GiB.
  int64_t max_inference_memory_bytes = int64_t{4} << 30;
  // Options for every model (runners, CUDA device, require_complete).
  LoadOptions load_options;
  // Device type the server runs models on ("cpu" or "cuda"): an artifact
  // captured for the other one is refused at load.
  std::string device = "cpu";
  // Re-scan the repository this often; zero: only on request.
  absl::Duration repository_poll_interval = absl::ZeroDuration();
  // The server is ready (ServerReady, health "") only while every model of
  // the repository is served: none is loading and none failed to load. When
  // false, ready as soon as the first scan is done. Default: true.
  bool strict_readiness = true;
  // Clients reconnect after this long (zero: never), so that new replicas
  // behind a Service get their share of long-lived connections.
  absl::Duration max_connection_age = absl::ZeroDuration();
  // How long Stop() waits for running calls.
  absl::Duration drain_timeout = absl::Seconds(30);
  // An inference request still running this long after it arrived ends with
  // DEADLINE_EXCEEDED: checked before each frame runs and at each loop
  // iteration of a TorchScript eager program. Zero (the default here; the
  // server binary's is 30 s): no limit but the client's own deadline.
  absl::Duration max_request_time = absl::ZeroDuration();
  // When non-empty, admin and repository-control calls need the metadata
  // "authorization: Bearer <token>" (see server/api/control_access.h).
  std::string admin_token;
  // Without a token, calls that load, unload or rescan models are refused
  // (PERMISSION_DENIED) unless this is set. For local development only.
  // Default: false.
  bool allow_unauthenticated_control = false;
  // TLS: PEM files. With a certificate and key the server speaks TLS only,
  // on gRPC and HTTP; with a client CA too, clients must present a
  // certificate it signed (over HTTP, on every path but /v2/health/*).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

class Server final : public RepositoryListener {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  ~Server() override;

  void BeginDrain();
  bool ready() const { return state_.ready(); }
  // OK if every call finished within the drain timeout; otherwise
  // DEADLINE_EXCEEDED naming what was still running.
  absl::Status Stop();

  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_ ? metrics_->http_port() : 0; }
  int http_port() const { return http_ ? http_->port() : 0; }
  ModelRepository& repository() { return *repository_; }

  void OnModelState(const ModelState& state) override;
  void OnLoadFailure(const std::string& name, int64_t version,
                     const std::string& reason) override;

 private:
  explicit Server(ServerOptions options);
  absl::Status Listen();
  // Recomputes readiness from the repository and tells the health service.
  void UpdateReadiness();
  // Once a second until Stop: not live while the device is lost
  // (runtime/device_health.h), or while requests in flight have made no
  // progress for longer than `bound`.
  void WatchProgress(absl::Duration bound);

  const ServerOptions options_;
  ServingState state_;
  std::unique_ptr<RequestScheduler> scheduler_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<ModelRepository> repository_;
  // Outlive the API that writes to them.
  std::unique_ptr<RequestTracer> tracer_;
  std::unique_ptr<SequenceStore> sequences_;
  std::unique_ptr<InferenceApi> api_;
  std::unique_ptr<InferenceService> inference_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<HealthService> health_;
  // Held from reading draining() to setting a health status, and while the
  // drain begins: a model that turns ready on the repository's thread as the
  // drain begins cannot be set SERVING after BeginDrain set it NOT_SERVING.
  absl::Mutex health_mu_;
  // Stops after the gRPC server, before the services it calls go.
  std::unique_ptr<UnaryCallRouter> unary_calls_;
  std::unique_ptr<HttpService> http_;
  std::unique_ptr<grpc::Server> grpc_server_;
  Http2FrontStats front_stats_;
  // The front's TLS, with a certificate: it outlives the front.
  SslContext front_tls_;
  std::unique_ptr<Http2Front> front_;
  int grpc_port_ = 0;
  Notification stop_polling_;
  std::thread poller_;
  // Watches that requests in flight make progress (RequestScheduler::
  // StalledFor): past twice --max_request_seconds (at least 10 s) without
  // one finishing, the server is neither live nor ready until one does.
  std::thread watchdog_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_SERVER_H_
