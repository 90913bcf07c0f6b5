// The KServe v2 HTTP/REST endpoint: the transport for
// server/api/inference_api.h beside gRPC, on the project's HTTP/1.1 server
// (server/http/http_transport.h, which bounds what a client may hold: head
// sizes, body sizes and their sum, time to send a request, connections).
//
// Paths are server/http/http_routes.h's, each answered by a handler of
// its own; bodies and status codes are server/http/http_codec.h's. Inference
// requests go to the same request scheduler as gRPC's, so the limit of
// concurrent requests, draining and the metrics count both; a request past
// the limit gets 429. A client that closes its connection cancels its
// request. The health probes are answered on the connection thread, so they
// answer while every thread that runs requests is busy.
//
// Refused from the head alone, before any of the body is read (and the
// connection closed after): a body over the limit (413) or without a
// Content-Length (411), a compressed body (415: its size unpacked is
// unknown), a body over 64 KiB on any path but inference (413: the other
// paths take a few bytes of JSON), and, with a client CA, a request without
// a client certificate on any path but /v2/health/live and /v2/health/ready
// (401: Kubernetes' HTTPS probes present none).
//
// Thread safety: Start and Stop from one controlling thread.
#ifndef PRECOMPILE_SERVER_HTTP_HTTP_SERVICE_H_
#define PRECOMPILE_SERVER_HTTP_HTTP_SERVICE_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/api/control_access.h"
#include "server/api/inference_api.h"
#include "server/http/http_transport.h"
#include "server/scheduling/request_scheduler.h"

namespace precompile::server {

struct HttpRoute;  // server/http/http_routes.h

struct HttpOptions {
  // host:port; port 0 picks a free one (see HttpService::port()).
  std::string address = "0.0.0.0:8000";
  // Threads that handle requests once they have arrived whole.
  int threads = 64;
  int max_connections = 1024;
  size_t max_body_bytes = 256 << 20;
  // All the request bodies held at once (server/http/http_transport.h).
  size_t max_body_buffer_bytes = size_t{1} << 30;
  absl::Duration request_timeout = absl::Seconds(30);
  // PEM files, as the gRPC port's (server/server.h).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

class HttpService final : private HttpHandler {
 public:
  // Listens and serves until Stop. The references must outlive the service.
  static absl::StatusOr<std::unique_ptr<HttpService>> Start(const HttpOptions& options,
                                                            InferenceApi& api,
                                                            RequestScheduler& scheduler,
                                                            ControlAccess access);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  int port() const { return transport_->port(); }
  // Stops listening and waits for the requests being answered; requests
  // partly received may arrive whole until `deadline` (HttpTransport::Stop).
  // Idempotent.
  void Stop(absl::Time deadline);

 private:
  HttpService(const HttpOptions& options, InferenceApi& api, RequestScheduler& scheduler,
              ControlAccess access);
  std::optional<HttpAnswer> Screen(const HttpRequest& request) override;
  void Handle(HttpExchange& exchange) override;
  HttpAnswer Refusal(int status, absl::string_view message) override;
  // A request and the route its path took: what each handler answers.
  struct Routed {
    const HttpRequest& http;
    const HttpRoute& route;
  };
  using Handler = HttpAnswer (HttpService::*)(const Routed&);
  // Every route's answer but inference's, on a worker: the route's handler.
  HttpAnswer Answer(const HttpRequest& request, const HttpRoute& route);
  HttpAnswer NotFound(const Routed& r);
  HttpAnswer WrongMethod(const Routed& r);
  HttpAnswer ServerLive(const Routed& r);
  HttpAnswer ServerReady(const Routed& r);
  HttpAnswer ModelReady(const Routed& r);
  HttpAnswer ServerMetadata(const Routed& r);
  HttpAnswer ModelMetadata(const Routed& r);
  HttpAnswer ModelStatistics(const Routed& r);
  HttpAnswer ModelConfig(const Routed& r);
  HttpAnswer RepositoryIndex(const Routed& r);
  // Load and unload need the control token.
  HttpAnswer ModelLoad(const Routed& r);
  HttpAnswer ModelUnload(const Routed& r);
  // GET reads, POST changes (with the control token) trace settings.
  HttpAnswer TraceSetting(const Routed& r);
  // Whether the request may load, unload or change settings (its
  // Authorization header).
  absl::Status CheckControl(const HttpRequest& request) const;

  const HttpOptions options_;
  InferenceApi& api_;
  RequestScheduler& scheduler_;
  const ControlAccess access_;
  const bool client_certificates_;
  std::unique_ptr<HttpTransport> transport_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_HTTP_SERVICE_H_
