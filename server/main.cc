// precompile_server: serves the precompile artifacts of a model repository
// over gRPC (KServe v2 inference, precompile admin, health, reflection) with
// Prometheus metrics over HTTP. SIGTERM or Ctrl-C drains and exits.
#include <dlfcn.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/rate_limited_lines.h"
#include "base/usable_cores.h"
#include "runtime/device_health.h"
#include "runtime/library_errors.h"
#include "runtime/torch_threads.h"
#include "server/api/control_access.h"
#include "server/server.h"

ABSL_FLAG(std::string, model_repository, "",
          "Directory of models: <repository>/<model>/<version>/ (required)");
ABSL_FLAG(std::string, listen_address, "0.0.0.0", "Address gRPC, HTTP and metrics listen on");
ABSL_FLAG(int, grpc_port, 8001, "gRPC port (KServe v2, admin, health, reflection)");
ABSL_FLAG(int, metrics_port, 8002, "Prometheus /metrics port; -1 disables it");
ABSL_FLAG(int, http_port, 8000,
          "KServe v2 HTTP/REST port (HTTPS with --tls_cert); 0 picks a free port, -1 "
          "disables it");
ABSL_FLAG(int, http_threads, 64,
          "Threads handling HTTP requests once they have arrived whole (a connection that "
          "sends or idles holds none)");
ABSL_FLAG(int, http_max_connections, 1024,
          "HTTP connections open at once; past it, the one idle longest is closed");
ABSL_FLAG(int64_t, http_max_body_buffer_bytes, int64_t{1} << 30,
          "Bytes of HTTP request bodies (arriving or being answered) and answers not yet sent "
          "held at once; a request that would pass it gets 429 before its body is read");
ABSL_FLAG(int, http_request_timeout_seconds, 30,
          "An HTTP request must arrive whole within this (plus a second per MiB of body); a "
          "client idle this long between requests is disconnected");
ABSL_FLAG(std::string, device, "cpu",
          "Device models run on: cpu, cuda or cuda:N; artifacts for another "
          "device type are refused");
ABSL_FLAG(bool, cuda_stream_per_call, true,
          "On CUDA, run each model call on a stream of its own (false: every call on the "
          "device's default stream, one after another)");
ABSL_FLAG(bool, cuda_pinned_staging, true,
          "On CUDA, copy request tensors to the device and outputs back through pinned host "
          "buffers, waiting for the call's stream once (false: from and to pageable memory, "
          "each copy back waiting)");
ABSL_FLAG(bool, require_complete, false,
          "Refuse artifacts whose capture is incomplete (uncovered frames or truncated)");
ABSL_FLAG(int, miss_signatures_per_frame, 64,
          "Distinct signatures of calls no variant matched kept per frame and model "
          "version, the most frequent (see the admin RPC Misses); 0 records none");
ABSL_FLAG(bool, allow_python_programs, false,
          "Load artifacts with Python eager programs. Loading one unpickles it (torch.load), "
          "which runs the code it names: without this flag such artifacts are refused");
ABSL_FLAG(std::vector<std::string>, python_path, {},
          "Directories, comma-separated, put first on the Python interpreter's sys.path (the "
          "models' own code); the interpreter starts isolated and reads no PYTHONPATH");
ABSL_FLAG(std::string, python_env, "",
          "The Python environment (a directory holding bin/python3) that runs the Python "
          "eager programs of artifacts that have them; started at the first such artifact. "
          "Default: the environment the server was built with");
ABSL_FLAG(std::string, python_plugin, "",
          "The Python plugin library (libprecompile_python.so). Default: "
          "../runtime/libprecompile_python.so relative to this binary's directory");
ABSL_FLAG(int, max_message_bytes, 256 << 20,
          "Largest gRPC request or response, and largest HTTP request body");
ABSL_FLAG(int, max_concurrent_requests, 128,
          "Inference requests admitted at once, running or queued; more get "
          "RESOURCE_EXHAUSTED (0: no limit)");
ABSL_FLAG(int64_t, max_in_flight_request_bytes, int64_t{1} << 30,
          "Bytes of the inference requests admitted at once (gRPC messages, HTTP bodies), "
          "running or queued; a request that would pass it gets RESOURCE_EXHAUSTED (0: no "
          "limit). At least --max_message_bytes");
ABSL_FLAG(int64_t, sequence_state_bytes, int64_t{1} << 30,
          "Bytes of sequences' state (models whose config.pbtxt has sequence_batching) held "
          "at once; past it the sequence idle longest is evicted, and a sequence that still "
          "does not fit is refused RESOURCE_EXHAUSTED (0: no sequence may start)");
ABSL_FLAG(int64_t, sequence_state_bytes_per_client, 0,
          "Bytes of sequences' state one client may hold at once (a client certificate under "
          "--tls_client_ca; all clients without one share one); past it that client's own "
          "sequence idle longest is evicted, so that no client pushes the others' out beyond "
          "its share (0: no share, only --sequence_state_bytes)");
ABSL_FLAG(int64_t, max_inference_memory_bytes, int64_t{4} << 30,
          "Bytes of CPU tensors that model calls hold at once (intermediate buffers, outputs, "
          "what eager programs allocate); a call whose allocation would pass it gets "
          "RESOURCE_EXHAUSTED (0: no limit, and nothing counted)");
ABSL_FLAG(int, inference_threads, 0,
          "Threads running inference requests; more wait in a queue (0: one per core "
          "the process may use, as --torch_threads counts them)");
ABSL_FLAG(int, inference_pollers, 0,
          "Threads taking inference requests from gRPC, more than --inference_threads; "
          "each runs what it took while a slot is free (0: 2 * inference_threads + 2)");
ABSL_FLAG(int, eager_threads, 0,
          "Threads running eager misses (entry frames' eager programs), at a lower "
          "priority than requests (0: one per inference thread)");
ABSL_FLAG(int, eager_nice, 10,
          "How much the eager threads' nice value is raised, 0 to 19, so that variant "
          "hits go first on busy cores (0: the priority of requests)");
ABSL_FLAG(int, grpc_window_bytes, 1 << 20,
          "A fixed flow-control window per gRPC stream, so that each connection's share of "
          "--grpc_memory_bytes stays small; a stream's throughput is about window / round "
          "trip (0: gRPC's adaptive window, which grows to many MiB per connection)");
ABSL_FLAG(int64_t, grpc_memory_bytes, int64_t{1} << 30,
          "Memory gRPC may take for the messages it is receiving and sending, before any "
          "is admitted; near it, senders wait for flow-control window (0: no limit)");
ABSL_FLAG(int64_t, grpc_unsent_answer_bytes, int64_t{1} << 30,
          "Bytes of gRPC answers their clients have not taken whole yet (a client that "
          "grants no flow-control window never does); at it, new inference calls get "
          "RESOURCE_EXHAUSTED (0: no limit)");
ABSL_FLAG(int, grpc_answer_timeout_seconds, 60,
          "A gRPC answer its client has not taken whole this long after it was ready is "
          "dropped and its call cancelled (0: no limit; a client's own deadline also ends it)");
ABSL_FLAG(int, grpc_max_streams_per_connection, 100,
          "Streams (calls) one gRPC connection may have open at once; clients queue more "
          "(0: no limit)");
ABSL_FLAG(bool, grpc_front, true,
          "Relay gRPC connections through the server's own front, which keeps the limits "
          "below that gRPC does not, and ends TLS with --tls_cert (without it, put an HTTP/2 "
          "proxy in front: SECURITY.md)");
ABSL_FLAG(int, grpc_max_connections, 1024,
          "gRPC connections open at once (through the front); past it a new one takes the "
          "place of the one with no call open that has gone longest without one (with none, "
          "it is closed)");
ABSL_FLAG(int, grpc_max_open_streams, 4096,
          "Streams (calls) open on all gRPC connections together, each about 13-18 KiB that "
          "no other limit counts; past it the connection holding the most is closed (0: no "
          "limit; through the front)");
ABSL_FLAG(int, grpc_relay_threads, 0,
          "Threads relaying gRPC connections through the front, each moving about 3 GB/s "
          "(0: one per usable core, at most 4)");
ABSL_FLAG(int, grpc_max_resets_per_second, 100,
          "Calls one gRPC connection may cancel before their answers each second, with a "
          "burst of twice as many (HTTP/2's rapid reset); past it the connection is closed "
          "(0: no limit; through the front)");
ABSL_FLAG(int, grpc_unary_threads, 4,
          "Threads serving the gRPC methods other than ModelInfer, health and reflection "
          "(metadata, readiness, statistics, repository, admin)");
ABSL_FLAG(int, torch_threads, 0,
          "Threads per torch operation and per compiled kernel of a model call (0: the cores "
          "the process may use: its CPU affinity, and its cgroup's CPU quota rounded up)");
ABSL_FLAG(int, runners_per_variant, 2,
          "Instances of each compiled variant that run at once");
ABSL_FLAG(std::vector<std::string>, op_library, {},
          "Shared libraries (comma-separated) registering custom operators that "
          "compiled variants call; loaded before any model");
ABSL_FLAG(int, repository_poll_seconds, 0,
          "Re-scan the repository this often for new models and versions (0: never)");
ABSL_FLAG(bool, strict_readiness, true,
          "Ready (ServerReady, health \"\") only while every model of the repository is "
          "served; false: ready once the repository has been scanned");
ABSL_FLAG(int, max_connection_age_seconds, 0,
          "Ask clients to reconnect after this long (0: never), so that new replicas "
          "get a share of long-lived connections");
ABSL_FLAG(int, max_request_seconds, 30,
          "An inference request still running this long after it arrived ends with "
          "DEADLINE_EXCEEDED (checked between frames and in eager programs' loops); 0: no limit");
ABSL_FLAG(int, drain_timeout_seconds, 30,
          "On SIGTERM, how long running requests may take before the server exits non-zero");
ABSL_FLAG(int, shutdown_delay_seconds, 0,
          "On SIGTERM, keep serving (not ready) this long before draining, so that "
          "load balancers stop sending new requests");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding a token that admin and repository-control calls must send "
          "as 'authorization: Bearer <token>' (readable by the server's user or group "
          "only; a trailing newline is fine)");
ABSL_FLAG(bool, allow_unauthenticated_control, false,
          "Without --admin_token_file, let any client load, unload and rescan models "
          "(for local development; without either, such calls are refused)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(std::string, trace_file, "",
          "Where request traces are written (Triton's trace JSON); empty: nowhere, and "
          "tracing cannot be turned on");
ABSL_FLAG(std::string, trace_level, "OFF",
          "OFF or TIMESTAMPS: whether requests are traced (changed at run time through "
          "/v2/trace/setting and the TraceSetting RPC, with the admin token)");
ABSL_FLAG(int64_t, trace_rate, 1000, "Every Nth request is traced");
ABSL_FLAG(int64_t, trace_count, -1, "How many requests are traced, then no more (-1: no end)");
ABSL_FLAG(int64_t, trace_log_frequency, 0,
          "0: every trace goes to --trace_file; N: every N traces go to a file of their own, "
          "<trace_file>.0, <trace_file>.1, ...");
ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error");

namespace {

int Fail(const std::string& message) {
  spdlog::error("event=startup_failed reason=\"{}\"", message);
  return 2;
}

// The server's options from the flags, or which flag is wrong. One flag
// after another, as the flags are declared above: split up, the checks that
// relate two flags would lose sight of each other.
absl::StatusOr<precompile::server::ServerOptions> OptionsFromFlags() {
  precompile::server::ServerOptions options;
  options.model_repository = absl::GetFlag(FLAGS_model_repository);
  if (options.model_repository.empty()) return absl::InvalidArgumentError("--model_repository is required");
  const std::string host = absl::GetFlag(FLAGS_listen_address);
  options.grpc_address = absl::StrCat(host, ":", absl::GetFlag(FLAGS_grpc_port));
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_address = metrics_port < 0 ? "" : absl::StrCat(host, ":", metrics_port);
  const int http_port = absl::GetFlag(FLAGS_http_port);
  options.http_address = http_port < 0 ? "" : absl::StrCat(host, ":", http_port);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.http_max_body_buffer_bytes = absl::GetFlag(FLAGS_http_max_body_buffer_bytes);
  options.http_request_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_http_request_timeout_seconds));
  std::string device = absl::GetFlag(FLAGS_device);
  if (device.rfind("cuda:", 0) == 0) {
    int index = 0;
    if (!absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--device=", device, " is not cpu, cuda or cuda:N"));
    }
    options.load_options.cuda_device_index = index;
    device = "cuda";
  }
  options.device = device;
  options.load_options.cuda_stream_per_call = absl::GetFlag(FLAGS_cuda_stream_per_call);
  options.load_options.cuda_pinned_staging = absl::GetFlag(FLAGS_cuda_pinned_staging);
  options.load_options.require_complete = absl::GetFlag(FLAGS_require_complete);
  options.load_options.runners_per_variant = absl::GetFlag(FLAGS_runners_per_variant);
  const int miss_signatures = absl::GetFlag(FLAGS_miss_signatures_per_frame);
  if (miss_signatures < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--miss_signatures_per_frame=", miss_signatures,
                             " is negative; 0 records no misses"));
  }
  options.load_options.miss_signatures_per_frame = miss_signatures;
  options.load_options.allow_python_programs = absl::GetFlag(FLAGS_allow_python_programs);
  options.load_options.python_environment = absl::GetFlag(FLAGS_python_env);
  options.load_options.python_path = absl::GetFlag(FLAGS_python_path);
  options.load_options.python_plugin = absl::GetFlag(FLAGS_python_plugin);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  options.max_in_flight_request_bytes = absl::GetFlag(FLAGS_max_in_flight_request_bytes);
  if (options.max_in_flight_request_bytes < 0) {
    return absl::InvalidArgumentError("--max_in_flight_request_bytes must be at least 0");
  }
  // Below one request of the largest size, such a request would be refused
  // for ever.
  if (options.max_in_flight_request_bytes > 0 &&
      options.max_in_flight_request_bytes < absl::GetFlag(FLAGS_max_message_bytes)) {
    return absl::InvalidArgumentError("--max_in_flight_request_bytes must be 0 or at least --max_message_bytes");
  }
  options.sequence_state_bytes = absl::GetFlag(FLAGS_sequence_state_bytes);
  if (options.sequence_state_bytes < 0) {
    return absl::InvalidArgumentError("--sequence_state_bytes must be at least 0");
  }
  options.sequence_state_bytes_per_client =
      absl::GetFlag(FLAGS_sequence_state_bytes_per_client);
  if (options.sequence_state_bytes_per_client < 0) {
    return absl::InvalidArgumentError("--sequence_state_bytes_per_client must be at least 0");
  }
  options.max_inference_memory_bytes = absl::GetFlag(FLAGS_max_inference_memory_bytes);
  if (options.max_inference_memory_bytes < 0) {
    return absl::InvalidArgumentError("--max_inference_memory_bytes must be at least 0");
  }
  options.grpc_memory_bytes = absl::GetFlag(FLAGS_grpc_memory_bytes);
  if (options.grpc_memory_bytes < 0) return absl::InvalidArgumentError("--grpc_memory_bytes must be at least 0");
  options.grpc_window_bytes = absl::GetFlag(FLAGS_grpc_window_bytes);
  if (options.grpc_window_bytes < 0) return absl::InvalidArgumentError("--grpc_window_bytes must be at least 0");
  options.grpc_max_streams_per_connection = absl::GetFlag(FLAGS_grpc_max_streams_per_connection);
  if (options.grpc_max_streams_per_connection < 0) return absl::InvalidArgumentError("--grpc_max_streams_per_connection must be at least 0");
  options.grpc_front = absl::GetFlag(FLAGS_grpc_front);
  options.grpc_max_connections = absl::GetFlag(FLAGS_grpc_max_connections);
  if (options.grpc_max_connections < 1) {
    return absl::InvalidArgumentError("--grpc_max_connections must be at least 1");
  }
  options.grpc_max_open_streams = absl::GetFlag(FLAGS_grpc_max_open_streams);
  if (options.grpc_max_open_streams < 0) {
    return absl::InvalidArgumentError("--grpc_max_open_streams must be at least 0");
  }
  options.grpc_relay_threads = absl::GetFlag(FLAGS_grpc_relay_threads);
  if (options.grpc_relay_threads < 0) {
    return absl::InvalidArgumentError("--grpc_relay_threads must be at least 0");
  }
  if (options.grpc_relay_threads == 0) {
    options.grpc_relay_threads = std::min(precompile::UsableCores(), 4);
  }
  options.grpc_max_resets_per_second = absl::GetFlag(FLAGS_grpc_max_resets_per_second);
  if (options.grpc_max_resets_per_second < 0) {
    return absl::InvalidArgumentError("--grpc_max_resets_per_second must be at least 0");
  }
  options.grpc_unary_threads = absl::GetFlag(FLAGS_grpc_unary_threads);
  if (options.grpc_unary_threads < 1) {
    return absl::InvalidArgumentError("--grpc_unary_threads must be at least 1");
  }
  options.trace_file = absl::GetFlag(FLAGS_trace_file);
  {
    // The same parsing and limits as the settings a client changes.
    using precompile::server::RequestTracer;
    absl::StatusOr<precompile::server::TraceConfig> trace = RequestTracer::Parse(
        {{"trace_level", std::vector<std::string>{absl::GetFlag(FLAGS_trace_level)}},
         {"trace_rate", std::vector<std::string>{absl::StrCat(absl::GetFlag(FLAGS_trace_rate))}},
         {"trace_count", std::vector<std::string>{absl::StrCat(absl::GetFlag(FLAGS_trace_count))}},
         {"log_frequency",
          std::vector<std::string>{absl::StrCat(absl::GetFlag(FLAGS_trace_log_frequency))}}},
        /*allow_clear=*/false);
    if (!trace.ok()) return absl::InvalidArgumentError(std::string(trace.status().message()));
    if (*trace->timestamps && options.trace_file.empty()) {
      return absl::InvalidArgumentError("--trace_level=TIMESTAMPS needs --trace_file");
    }
    options.trace = *trace;
  }
  options.grpc_answers.max_unsent_bytes = absl::GetFlag(FLAGS_grpc_unsent_answer_bytes);
  if (options.grpc_answers.max_unsent_bytes < 0) {
    return absl::InvalidArgumentError("--grpc_unsent_answer_bytes must be at least 0");
  }
  if (absl::GetFlag(FLAGS_grpc_answer_timeout_seconds) < 0) {
    return absl::InvalidArgumentError("--grpc_answer_timeout_seconds must be at least 0");
  }
  options.grpc_answers.timeout = absl::Seconds(absl::GetFlag(FLAGS_grpc_answer_timeout_seconds));
  options.inference_threads = absl::GetFlag(FLAGS_inference_threads);
  options.inference_pollers = absl::GetFlag(FLAGS_inference_pollers);
  options.eager_threads = absl::GetFlag(FLAGS_eager_threads);
  options.eager_nice = absl::GetFlag(FLAGS_eager_nice);
  options.repository_poll_interval =
      absl::Seconds(absl::GetFlag(FLAGS_repository_poll_seconds));
  options.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_seconds));
  if (absl::GetFlag(FLAGS_max_request_seconds) < 0) {
    return absl::InvalidArgumentError("--max_request_seconds must be at least 0");
  }
  options.max_request_time = absl::Seconds(absl::GetFlag(FLAGS_max_request_seconds));
  if (options.http_max_connections < 1) return absl::InvalidArgumentError("--http_max_connections must be at least 1");
  // Below one body of the largest size, such a body would be refused for ever.
  if (options.http_max_body_buffer_bytes < absl::GetFlag(FLAGS_max_message_bytes)) {
    return absl::InvalidArgumentError("--http_max_body_buffer_bytes must be at least --max_message_bytes");
  }
  options.strict_readiness = absl::GetFlag(FLAGS_strict_readiness);
  options.max_connection_age =
      absl::Seconds(absl::GetFlag(FLAGS_max_connection_age_seconds));
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  if (const std::string token_file = absl::GetFlag(FLAGS_admin_token_file);
      !token_file.empty()) {
    absl::StatusOr<std::string> token = precompile::server::ReadAdminTokenFile(token_file);
    if (!token.ok()) return absl::InvalidArgumentError(std::string(token.status().message()));
    options.admin_token = *token;
  }
  options.allow_unauthenticated_control = absl::GetFlag(FLAGS_allow_unauthenticated_control);
  if (options.admin_token.empty() && options.allow_unauthenticated_control) {
    spdlog::warn(
        "event=unauthenticated_control note=\"any client that reaches the gRPC port can load, "
        "unload and rescan models (--allow_unauthenticated_control): for local development "
        "only; use --admin_token_file elsewhere\"");
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves precompile artifacts over gRPC and HTTP/REST (KServe v2).\n"
      "  precompile_server --model_repository=DIR [--grpc_port=8001] [--http_port=8000] "
      "[--metrics_port=8002]");
  // --help lists the flags of this file (absl's default looks for a file
  // named after the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil checks every absl::Mutex acquisition (gRPC takes many per
  // call) against a process-wide lock graph; that costs ~10% of a small
  // request's instructions and finds nothing gRPC's own tests would not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %l %v");
  // What libtorch and AOTInductor write themselves (std::cerr) goes out at a
  // bounded rate: AOTInductor writes two lines for every call that fails
  // inside a model, as fast as clients make calls fail. Each line gets the
  // time and level the server's own lines start with, and says whose it is.
  // Never destroyed: a library may still write while the process exits.
  precompile::RateLimitedLines::Options stderr_options;
  // AOTInductor logs an exception here and returns only an error code: the
  // run that failed takes the exception from its thread's lines.
  stderr_options.observe = precompile::NoteLibraryLine;
  std::cerr.rdbuf(new precompile::RateLimitedLines(stderr_options, [](absl::string_view text) {
    const std::string stamped =
        absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3S", absl::Now(), absl::LocalTimeZone()),
                     " warning [stderr] ", text);
    absl::string_view line = stamped;
    while (!line.empty()) {
      const ssize_t written = write(STDERR_FILENO, line.data(), line.size());
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) return;
      line.remove_prefix(static_cast<size_t>(written));
    }
  }));

  // Signals are taken by sigwait below, not by handlers on random threads:
  // block them before any thread starts so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<precompile::server::ServerOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  // Before the first model loads: AOTInductor resolves a variant's custom
  // operators by name when the variant is loaded.
  for (const std::string& library : absl::GetFlag(FLAGS_op_library)) {
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      return Fail(absl::StrCat("--op_library: ", dlerror()));
    }
    spdlog::info("event=op_library_loaded path={}", library);
  }
  // Every model call's thread gets this count (runtime/torch_threads.h),
  // never the capture machine's.
  const int usable_cores = precompile::UsableCores();
  int torch_threads = absl::GetFlag(FLAGS_torch_threads);
  if (torch_threads <= 0) torch_threads = usable_cores;
  precompile::SetTorchThreads(torch_threads);
  spdlog::info("event=cpu usable_cores={} torch_threads={}", usable_cores, torch_threads);

  auto server = precompile::server::Server::Start(*std::move(options));
  if (!server.ok()) return Fail(std::string(server.status().message()));

  int signal = 0;
  sigwait(&signals, &signal);
  spdlog::info("event=signal signal={}", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->BeginDrain();
  if (const int delay = absl::GetFlag(FLAGS_shutdown_delay_seconds); delay > 0) {
    absl::SleepFor(absl::Seconds(delay));
  }
  absl::Status stopped = (*server)->Stop();
  if (!stopped.ok()) {
    spdlog::error("event=drain_incomplete reason=\"{}\"", std::string(stopped.message()));
    spdlog::shutdown();
    std::_Exit(1);
  }
  // With its CUDA context poisoned, tearing down a model on it throws from
  // AOTInductor's destructors, which would end the drained process with
  // SIGABRT. Nothing is left to run: leave without unloading, saying why.
  if (precompile::DeviceLostReason()) {
    spdlog::error("event=exit_device_lost message=\"drained; the models are left loaded, as "
                  "the device they are on is lost\"");
    spdlog::shutdown();
    std::_Exit(3);
  }
  return 0;
}
