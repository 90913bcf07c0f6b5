#include "server/server.h"

#include <sched.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/log_text.h"
#include "base/usable_cores.h"
#include "runtime/device_health.h"
#include "runtime/inference_memory.h"

namespace precompile::server {
namespace {

// What a request to a gRPC method other than ModelInfer may take, as the
// HTTP transport's paths other than inference: those requests name a model,
// a version, a few settings.
constexpr size_t kMaxUnaryRequestBytes = 64 << 10;

// The gRPC health service that says what ServerLive says, for liveness
// probes: "" is readiness, which a model that failed to load, or a drain,
// turns NOT_SERVING while the server is well. Named as the HTTP transport's
// path that says the same, which no model can be named (no '/').
constexpr char kLiveService[] = "/v2/health/live";

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// Whether the TLS flags go together, whoever ends TLS (gRPC or the front).
absl::Status CheckTlsFlags(const ServerOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate (--tls_cert) and its key (--tls_key)");
  }
  if (options.tls_cert_file.empty() && !options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key: client certificates "
        "are checked only over TLS");
  }
  return absl::OkStatus();
}

// gRPC's own credentials, for a port without the front. REQUIRES:
// CheckTlsFlags(options).ok().
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& options) {
  if (options.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto cert = ReadFile(options.tls_cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  auto key = ReadFile(options.tls_key_file, "TLS key");
  if (!key.ok()) return key.status();
  pair.cert_chain = *cert;
  pair.private_key = *key;
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_client_ca_file.empty()) {
    auto ca = ReadFile(options.tls_client_ca_file, "client CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// How long the front may take to write out what gRPC sent last, once gRPC
// has shut down: clients that do not read it lose it.
constexpr absl::Duration kFrontFlushTime = absl::Seconds(1);
// The front closes a connection with this many times more streams open
// than gRPC allows (clients may open streams before they learn the limit).
constexpr int kFrontStreamsPerLimit = 4;

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      scheduler_(std::make_unique<RequestScheduler>(
          options_.inference_threads, options_.max_concurrent_requests,
          options_.max_in_flight_request_bytes,
          EagerThreads{options_.eager_threads, options_.eager_nice})) {
  state_.SetStrict(options_.strict_readiness);
}

Server::~Server() {
  // The transports wait below for their requests, some of which may wait
  // in a batch: run those now rather than after their delay.
  scheduler_->StopWaitingForBatches();
  if (!stop_polling_.HasBeenNotified()) stop_polling_.Notify();
  if (poller_.joinable()) poller_.join();
  if (watchdog_.joinable()) watchdog_.join();
  if (http_) http_->Stop(absl::Now());
  if (health_) health_->Shutdown();
  if (front_) front_->StopAccepting();
  if (grpc_server_) grpc_server_->Shutdown(std::chrono::system_clock::now());
  if (front_) front_->Stop(absl::Now() + kFrontFlushTime);
  // After gRPC's shutdown, so that no call arrives any more.
  if (inference_) inference_->StopServing();
  if (unary_calls_) unary_calls_->StopServing();
}

namespace {

// Checks the options that relate to each other and fills in the defaults
// that depend on the machine or on other options.
absl::Status CompleteOptions(ServerOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_directory(options.model_repository, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model repository '", options.model_repository, "' is not a directory"));
  }
  if (options.device != "cpu" && options.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or cuda, not '", options.device, "'"));
  }
  if (options.inference_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--inference_threads must be 0 (one per core) or more, not ", options.inference_threads));
  }
  if (options.inference_threads == 0) options.inference_threads = UsableCores();
  if (options.inference_pollers == 0) {
    options.inference_pollers = 2 * options.inference_threads + 2;
  } else if (options.inference_pollers <= options.inference_threads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--inference_pollers must exceed --inference_threads (", options.inference_threads,
        ") so that a thread is always free to take and refuse calls, not ",
        options.inference_pollers));
  }
  if (options.eager_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--eager_threads must be 0 (one per inference thread) or more, not ",
        options.eager_threads));
  }
  if (options.eager_threads == 0) options.eager_threads = options.inference_threads;
  if (options.eager_nice < 0 || options.eager_nice > 19) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eager_nice must be 0 to 19, not ", options.eager_nice));
  }
  options.load_options.device =
      options.device == "cuda" ? DeviceType::kCuda : DeviceType::kCpu;
  // What a request makes a model produce is bounded by what its response may
  // carry, checked before the model runs.
  if (options.load_options.max_output_bytes == 0 && options.max_message_bytes > 0) {
    options.load_options.max_output_bytes = static_cast<uint64_t>(options.max_message_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (absl::Status s = CompleteOptions(options); !s.ok()) return s;
  std::unique_ptr<Server> server(new Server(std::move(options)));
  const ServerOptions& o = server->options_;
  SetInferenceMemoryLimit(static_cast<uint64_t>(o.max_inference_memory_bytes));

  server->metrics_ = std::make_unique<ServerMetrics>();
  RepositoryOptions repository_options;
  repository_options.root = o.model_repository;
  repository_options.load_options = o.load_options;
  ServerMetrics* metrics = server->metrics_.get();
  repository_options.metrics_factory = [metrics](const std::string& name, int64_t version,
                                                 const LoadedVersion& model) {
    return metrics->ForModel(name, version, model);
  };
  server->repository_ =
      std::make_unique<ModelRepository>(std::move(repository_options), server.get());
  const ControlAccess access(o.admin_token, o.allow_unauthenticated_control);
  server->tracer_ = std::make_unique<RequestTracer>(o.trace_file, o.trace);
  SequenceStore::Options sequences;
  sequences.max_bytes = o.sequence_state_bytes;
  sequences.max_bytes_per_client = o.sequence_state_bytes_per_client;
  server->sequences_ = std::make_unique<SequenceStore>(sequences);
  server->api_ =
      std::make_unique<InferenceApi>(*server->repository_, metrics, server->state_,
                                     o.max_request_time, server->tracer_.get(),
                                     server->sequences_.get());
  server->inference_ = std::make_unique<InferenceService>(
      *server->api_, *server->scheduler_, access, o.inference_pollers, o.grpc_answers);
  server->admin_ = std::make_unique<AdminService>(*server->repository_, access);
  server->unary_calls_ =
      std::make_unique<UnaryCallRouter>(o.grpc_unary_threads, kMaxUnaryRequestBytes);
  server->inference_->RouteUnaryCalls(*server->unary_calls_);
  server->admin_->RouteUnaryCalls(*server->unary_calls_);
  for (absl::Status routed :
       {server->unary_calls_->CheckRoutes(InferenceService::Described(), {"ModelInfer"}),
        server->unary_calls_->CheckRoutes(AdminService::Described())}) {
    if (!routed.ok()) return routed;
  }
  // Load balancers watch the whole server or a model each.
  constexpr int kMaxHealthWatches = 1024;
  server->health_ = std::make_unique<HealthService>(kMaxHealthWatches);
  // Reflection is for people exploring the API with a tool; a few streams
  // at once are plenty, and each is memory a client holds as long as it likes.
  constexpr int kMaxReflectionStreams = 16;
  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{inference::GRPCInferenceService::service_full_name(),
                               AdminService::Described().full_name(), "grpc.health.v1.Health",
                               grpc::reflection::v1alpha::ServerReflection::service_full_name()},
      kMaxReflectionStreams);

  RequestScheduler* scheduler = server->scheduler_.get();
  const ServingState* state = &server->state_;
  const InferenceService* grpc_inference = server->inference_.get();
  SequenceStore* sequence_store = server->sequences_.get();
  const Http2FrontStats* front = &server->front_stats_;
  server->metrics_->ExportServerLoad([scheduler, state, grpc_inference, sequence_store, front] {
    ServerLoad load;
    load.draining = state->draining();
    load.in_flight = scheduler->in_flight();
    load.queued = scheduler->queued();
    load.eager_queued = scheduler->eager_queued();
    load.batch_waiting = scheduler->batch_waiting();
    load.run_slots = scheduler->run_slots();
    load.max_in_flight = scheduler->max_in_flight();
    load.in_flight_bytes = scheduler->in_flight_bytes();
    load.max_in_flight_bytes = scheduler->max_in_flight_bytes();
    load.grpc_unsent_answer_bytes = grpc_inference->unsent_answer_bytes();
    for (const SequenceStore::ModelStats& s : sequence_store->Stats()) {
      load.sequences.push_back(
          {s.model, s.active, s.state_bytes, s.ended, s.expired, s.evicted});
    }
    load.max_sequence_state_bytes = sequence_store->max_bytes();
    load.inference_memory_bytes = InferenceMemoryHeld();
    load.max_inference_memory_bytes = InferenceMemoryLimit();
    load.inference_memory_refusals = InferenceMemoryRefusals();
    load.grpc_closed_for_resets = front->closed_for_resets.load();
    load.grpc_closed_for_streams = front->closed_for_streams.load();
    load.grpc_refused_connections = front->refused_connections.load();
    return load;
  });
  if (!o.metrics_address.empty()) {
    if (absl::Status s = server->metrics_->StartHttp(o.metrics_address); !s.ok()) return s;
  }

  if (absl::Status s = server->Listen(); !s.ok()) return s;
  if (!o.http_address.empty()) {
    HttpOptions http;
    http.address = o.http_address;
    http.threads = o.http_threads;
    http.max_connections = o.http_max_connections;
    http.max_body_buffer_bytes = static_cast<size_t>(o.http_max_body_buffer_bytes);
    http.max_body_bytes = static_cast<size_t>(o.max_message_bytes);
    http.request_timeout = o.http_request_timeout;
    http.tls_cert_file = o.tls_cert_file;
    http.tls_key_file = o.tls_key_file;
    http.tls_client_ca_file = o.tls_client_ca_file;
    auto started = HttpService::Start(http, *server->api_, *server->scheduler_, access);
    if (!started.ok()) return started.status();
    server->http_ = *std::move(started);
  }
  spdlog::info("event=listening grpc_port={} metrics_port={} http_port={} repository={}",
               server->grpc_port_, server->metrics_port(), server->http_port(),
               o.model_repository);

  const std::vector<ModelState> states = server->repository_->Rescan();
  int ready = 0;
  for (const ModelState& s : states) ready += s.phase == ModelState::Phase::kReady;
  if (states.empty()) {
    spdlog::warn("event=repository_empty repository={} message=\"no models in the repository\"",
                 o.model_repository);
  }
  server->state_.SetReady();
  server->UpdateReadiness();
  spdlog::info("event={} models_ready={} models_failed={}",
               server->state_.ready() ? "ready" : "not_ready", ready, states.size() - ready);

  {
    // Without a request limit, no stall bound: the watchdog still watches
    // the device.
    Server* raw = server.get();
    const absl::Duration bound = o.max_request_time > absl::ZeroDuration()
                                     ? std::max(2 * o.max_request_time, absl::Seconds(10))
                                     : absl::InfiniteDuration();
    server->watchdog_ = std::thread([raw, bound] { raw->WatchProgress(bound); });
  }
  if (o.repository_poll_interval > absl::ZeroDuration()) {
    Server* raw = server.get();
    server->poller_ = std::thread([raw] {
      while (!raw->stop_polling_.WaitForNotificationWithTimeout(
          raw->options_.repository_poll_interval)) {
        raw->repository_->Rescan();
      }
    });
  }
  return server;
}

absl::Status Server::Listen() {
  if (absl::Status tls = CheckTlsFlags(options_); !tls.ok()) return tls;
  // The server's own health service (server/grpc/health_service.h).
  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  // Takes the connections the front relays (its hand-over keeps it). The
  // front ends TLS itself: gRPC serves what it relays as plain HTTP/2.
  std::shared_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
  if (options_.grpc_front) {
    if (!options_.tls_cert_file.empty()) {
      // gRPC's clients insist on ALPN's "h2"; with a client CA, a
      // certificate it signed is required, as gRPC's own TLS requires it.
      auto tls = MakeTlsServerContext(
          {options_.tls_cert_file, options_.tls_key_file, options_.tls_client_ca_file},
          "gRPC over TLS", !options_.tls_client_ca_file.empty(), absl::string_view("\x02h2", 3));
      if (!tls.ok()) return tls.status();
      front_tls_ = *std::move(tls);
    }
    acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
  } else {
    auto credentials = Credentials(options_);
    if (!credentials.ok()) return credentials.status();
    builder.AddListeningPort(options_.grpc_address, *credentials, &grpc_port_);
  }
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  if (options_.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(
                                   options_.max_connection_age)));
    // Calls running when the age is reached get this long to finish.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(
                                   options_.drain_timeout)));
  }
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  if (options_.grpc_max_streams_per_connection > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options_.grpc_max_streams_per_connection);
  }
  if (options_.grpc_window_bytes > 0) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               options_.grpc_window_bytes);
  }
  if (options_.grpc_memory_bytes > 0) {
    grpc::ResourceQuota quota("precompile-serve");
    quota.Resize(static_cast<size_t>(options_.grpc_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(inference_.get());
  builder.RegisterService(reflection_.get());
  builder.RegisterService(health_.get());
  builder.RegisterAsyncGenericService(unary_calls_->generic_service());
  std::unique_ptr<grpc::ServerCompletionQueue> inference_queue = builder.AddCompletionQueue();
  std::unique_ptr<grpc::ServerCompletionQueue> unary_queue = builder.AddCompletionQueue();
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ && acceptor) {
    Http2FrontOptions front_options;
    front_options.address = options_.grpc_address;
    front_options.max_connections = options_.grpc_max_connections;
    front_options.max_open_streams = options_.grpc_max_open_streams;
    front_options.relay_threads = options_.grpc_relay_threads;
    front_options.tls = front_tls_.get();
    // Calls find their clients' certificates by the names of their ends.
    front_options.name_peers = !options_.tls_client_ca_file.empty();
    // Past the limit gRPC refuses streams itself once the client has
    // acknowledged it; the front's bound is for clients that never do.
    front_options.limits.max_open_streams =
        options_.grpc_max_streams_per_connection > 0
            ? kFrontStreamsPerLimit * options_.grpc_max_streams_per_connection
            : 0;
    front_options.limits.resets_per_second = options_.grpc_max_resets_per_second;
    auto hand_over = [acceptor](int fd) {
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
      connection.fd = fd;
      acceptor->HandleNewConnection(&connection);
    };
    auto started = Http2Front::Start(front_options, hand_over, front_stats_);
    if (!started.ok()) return started.status();
    front_ = *std::move(started);
    grpc_port_ = front_->port();
    if (front_options.name_peers) {
      Http2Front* front = front_.get();
      inference_->SetClientCertificates(
          [front](absl::string_view peer) { return front->ClientCertificate(peer); });
    }
  }
  if (!grpc_server_ || grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", options_.grpc_address));
  }
  inference_->StartServing(std::move(inference_queue));
  unary_calls_->StartServing(std::move(unary_queue));
  // Live but not ready until the repository is loaded.
  health_->SetServingStatus(kLiveService, state_.live());
  health_->SetServingStatus("", false);
  return absl::OkStatus();
}

void Server::OnModelState(const ModelState& state) {
  if (metrics_) metrics_->OnModelState(state);
  if (grpc_server_) {
    absl::MutexLock lock(&health_mu_);
    if (!state_.draining()) {
      health_->SetServingStatus(state.name, state.phase == ModelState::Phase::kReady);
    }
  }
  if (repository_) UpdateReadiness();
}

void Server::UpdateReadiness() {
  bool ok = true;
  for (const ModelState& s : repository_->List()) {
    if (s.failed || s.phase == ModelState::Phase::kLoading) ok = false;
  }
  state_.SetModelsOk(ok);
  if (!grpc_server_) return;
  health_->SetServingStatus(kLiveService, state_.live());
  absl::MutexLock lock(&health_mu_);
  if (!state_.draining()) health_->SetServingStatus("", state_.ready());
}

void Server::WatchProgress(absl::Duration bound) {
  bool stalled = false;
  bool device_lost = false;
  while (!stop_polling_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
    inference_->DropUntakenAnswers(absl::Now());
    if (!device_lost) {
      if (std::optional<std::string> reason = DeviceLostReason()) {
        device_lost = true;
        state_.SetDeviceLost();
        spdlog::error("event=device_lost reason=\"{}\" message=\"every later call on the device "
                      "fails: not live, so that the server is restarted\"",
                      LoggedText(*reason, 1024));
        UpdateReadiness();
      }
    }
    const absl::Duration stalled_for = scheduler_->StalledFor(absl::Now());
    if ((stalled_for > bound) == stalled) continue;
    stalled = !stalled;
    state_.SetStalled(stalled);
    if (stalled) {
      spdlog::error("event=stalled in_flight_requests={} stalled_for={} message=\"no request has "
                    "finished for longer than any may run: not live until one does\"",
                    scheduler_->in_flight(), absl::FormatDuration(stalled_for));
    } else {
      spdlog::info("event=progress_resumed");
    }
    UpdateReadiness();
  }
}

void Server::OnLoadFailure(const std::string& name, int64_t, const std::string&) {
  if (metrics_) metrics_->OnLoadFailure(name);
}

void Server::BeginDrain() {
  {
    absl::MutexLock lock(&health_mu_);
    if (state_.draining()) return;
    state_.BeginDrain();
  }
  // Every health service (overall and per model) answers NOT_SERVING from now
  // on; the models stay loaded so running and late requests still succeed.
  // The models first: a client that sees the server's turn sees theirs.
  for (const ModelState& s : repository_->List()) health_->SetServingStatus(s.name, false);
  health_->SetServingStatus("", false);
  spdlog::info("event=draining in_flight_requests={}", scheduler_->in_flight());
}

absl::Status Server::Stop() {
  BeginDrain();
  if (!stop_polling_.HasBeenNotified()) stop_polling_.Notify();
  if (poller_.joinable()) poller_.join();
  if (watchdog_.joinable()) watchdog_.join();
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  // Stop accepting; let running calls finish. Shutdown cancels whatever is
  // still pending at the deadline, but a model call cannot be interrupted, so
  // wait for it separately and report it.
  auto grpc_shut_down = std::make_shared<Notification>();
  // Watch streams end once told NOT_SERVING, rather than at the deadline.
  health_->Shutdown();
  // New connections are refused, as gRPC's own listener refuses them.
  if (front_) front_->StopAccepting();
  std::thread shutdown([this, deadline, grpc_shut_down] {
    // Clients first stop sending calls and see those they sent answered:
    // gRPC's shutdown cancels the calls it holds that no thread has taken.
    if (front_) {
      front_->GoAway();
      if (!front_->AwaitGoneAway(deadline)) {
        spdlog::warn(
            "event=grpc_goaway_incomplete message=\"some gRPC clients still had calls "
            "open, or had not acknowledged the GOAWAY, at the drain deadline\"");
      }
    }
    grpc_server_->Shutdown(absl::ToChronoTime(deadline));
    grpc_shut_down->Notify();
  });
  // Waits for the HTTP requests being answered, which finish with the
  // scheduler's jobs.
  std::thread http_shutdown([this, deadline] {
    if (http_) http_->Stop(deadline);
  });
  scheduler_->StopWaitingForBatches();
  if (!scheduler_->AwaitIdle(deadline)) {
    const int left = scheduler_->in_flight();
    std::vector<std::string> running;
    for (const auto& [state, handle] : repository_->Served()) {
      if (const int calls = handle.model->calls_in_flight(); calls > 0) {
        running.push_back(absl::StrCat(state.name, " version ", handle.version, ": ", calls));
      }
    }
    shutdown.detach();
    http_shutdown.detach();
    return absl::DeadlineExceededError(absl::StrCat(
        left, " inference requests were still running after the drain timeout of ",
        absl::FormatDuration(options_.drain_timeout), " (",
        absl::StrJoin(running, ", "), ")"));
  }
  // gRPC's shutdown waits for the answers still being sent too: those their
  // clients do not take are dropped in time as while serving.
  while (!grpc_shut_down->WaitForNotificationWithTimeout(absl::Seconds(1))) {
    inference_->DropUntakenAnswers(absl::Now());
  }
  shutdown.join();
  // gRPC has closed its ends; the front writes out what it relays.
  if (front_) front_->Stop(absl::Now() + kFrontFlushTime);
  http_shutdown.join();
  inference_->StopServing();
  unary_calls_->StopServing();
  spdlog::info("event=stopped");
  return absl::OkStatus();
}

}  // namespace precompile::server
