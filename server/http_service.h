// The KServe v2 HTTP/REST endpoint: the transport for
// server/inference_api.h beside gRPC, on cpp-httplib (Debian's
// libcpp-httplib, built with OpenSSL 3).
//
// Paths, bodies and status codes are server/http_codec.h's. Inference
// requests go to the same request scheduler as gRPC's, so the limit of
// concurrent requests, draining and the metrics count both; a request past
// the limit gets 429. The service's `threads` read requests, run them (or
// wait while the scheduler queues them) and write answers; a thread holds
// its connection while it is kept alive, so `threads` bounds the
// connections served at once (more wait in the listen queue).
//
// A body is refused (413) from its Content-Length before any of it is
// stored when it is larger than `max_body_bytes`; a chunked body, whose
// size is known only once read, is refused (411). A compressed body (Content-Encoding) is refused (415)
// before it is read: its size unpacked is unknown. A client silent for
// `request_timeout` while it sends a request, or idle that long between
// requests, loses the connection.
//
// TLS: with a certificate and key, the port speaks HTTPS only. With a client
// CA too, every path but /v2/health/live and /v2/health/ready needs a
// client certificate it signed: Kubernetes' HTTPS probes present none.
//
// Thread safety: Start and Stop from one controlling thread.
#ifndef PRECOMPILE_SERVER_HTTP_SERVICE_H_
#define PRECOMPILE_SERVER_HTTP_SERVICE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/control_access.h"
#include "server/inference_api.h"
#include "server/request_scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace precompile::server {

struct HttpOptions {
  // host:port; port 0 picks a free one (see HttpService::port()).
  std::string address = "0.0.0.0:8000";
  int threads = 64;
  size_t max_body_bytes = 256 << 20;
  absl::Duration request_timeout = absl::Seconds(30);
  // PEM files, as the gRPC port's (server/server.h).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

class HttpService {
 public:
  // Listens and serves until Stop. The references must outlive the service.
  static absl::StatusOr<std::unique_ptr<HttpService>> Start(const HttpOptions& options,
                                                            InferenceApi& api,
                                                            RequestScheduler& scheduler,
                                                            ControlAccess access);
  ~HttpService();
  HttpService(const HttpService&) = delete;
  HttpService& operator=(const HttpService&) = delete;

  int port() const { return port_; }
  // Stops listening and waits for the requests being answered. Idempotent.
  void Stop();

 private:
  HttpService(const HttpOptions& options, InferenceApi& api, RequestScheduler& scheduler,
              ControlAccess access);
  // Before the body is read: false when it has answered (refusing what must
  // not be read, or a call without a body).
  bool Screen(const httplib::Request& request, httplib::Response& response);
  void Handle(const httplib::Request& request, httplib::Response& response);

  const HttpOptions options_;
  InferenceApi& api_;
  RequestScheduler& scheduler_;
  const ControlAccess access_;
  const bool client_certificates_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_SERVICE_H_
