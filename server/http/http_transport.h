// An HTTP/1.1 server (plain or TLS) built for clients nobody trusts: the
// transport under the KServe v2 endpoint (server/http/http_service.h), which
// supplies what requests mean through HttpHandler.
//
// One thread owns every socket. It accepts, reads heads and bodies, and
// writes answers, without blocking; a pool of `workers` threads handles the
// requests once they have arrived whole. So a connection costs a thread only
// while its request is handled, and a slow or silent client costs a few
// hundred bytes of memory, never a thread. What the connection thread
// guarantees:
//   - a head (request line and fields) is at most `max_head_bytes` with at
//     most `max_fields` fields (431), and is strictly parsed
//     (server/http/http_head.h: 400, 505);
//   - a body has a Content-Length of at most `max_body_bytes` (413) and no
//     Transfer-Encoding (411: its size is known only once read); all the
//     bodies held at once, arriving or being answered, and the answers not
//     yet written whole (a client that does not read leaves its answer in
//     the server's memory) add up to at most `max_body_buffer_bytes` (429
//     past it): a body counts from the moment its Content-Length is read,
//     before any of it is stored;
//   - a request arrives whole within `request_timeout` of its first byte,
//     plus a second per MiB of its body (408); a connection idle that long
//     between requests, or an answer the client takes no bytes of for that
//     long, loses its connection;
//   - HttpHandler::Screen answers what needs no body (health probes, refusals
//     from the head alone) on this thread, so probes are answered while
//     every worker is busy;
//   - an answer sent before the body was read closes the connection (the
//     unread body must not be read as the next request), after lingering up
//     to two seconds for the client to read it;
//   - a client that closes its connection while its request is handled
//     makes HttpExchange::cancelled() true: the work can stop early (a
//     client that only half-closes, shutting down its sending side, counts
//     as gone too);
//   - at most `max_connections` are open; a new one past it closes the
//     connection idle longest (or, if none is idle, the one that has sent
//     the least of its request for longest), so a flood of half-sent
//     requests cannot keep a probe out.
// HEAD is answered as GET without the body; pipelined requests are answered
// in order, one at a time. No chunked bodies, no HTTP/2, no upgrades.
//
// TLS: with a certificate and key, the port speaks HTTPS only (TLS 1.2 or
// later). With a client CA too, a client certificate is asked for and checked
// when given but not required at the handshake: HttpRequest says whether one
// was given, and the handler decides which paths need one.
//
// Thread safety: Start and Stop from one controlling thread; HttpExchange as
// documented there.
#ifndef PRECOMPILE_SERVER_HTTP_HTTP_TRANSPORT_H_
#define PRECOMPILE_SERVER_HTTP_HTTP_TRANSPORT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/http/http_head.h"

namespace precompile::server {

class HttpTransportLoop;

struct HttpTransportOptions {
  // host:port or [host]:port; port 0 picks a free one (HttpTransport::port).
  std::string address = "0.0.0.0:8000";
  int workers = 64;
  int max_connections = 1024;
  size_t max_head_bytes = 32 << 10;
  size_t max_fields = 100;
  size_t max_body_bytes = 256 << 20;
  // The flag that sets max_body_bytes, named when a body is refused for it.
  std::string max_body_flag = "--max_message_bytes";
  size_t max_body_buffer_bytes = size_t{1} << 30;
  absl::Duration request_timeout = absl::Seconds(30);
  // PEM files; an empty certificate serves plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
};

struct HttpRequest {
  HttpHead head;
  std::string body;
  // TLS only: the certificate, signed by its CA, that the client presented,
  // in PEM as gRPC gives its clients' (x509_pem_cert); empty without one.
  std::string client_certificate_pem;
};

struct HttpAnswer {
  int status = 200;
  std::string content_type;
  // A Cord, so that an answer can send bytes from where they are (a model's
  // output tensor) instead of a copy. The transport keeps what it borrows
  // until written, or until the socket fills: then what is left is copied
  // out, so that a client that does not read holds no tensor.
  absl::Cord body;
  // More fields; Content-Type, Content-Length and Connection are the
  // transport's.
  std::vector<std::pair<std::string, std::string>> fields;
};

// One request from its arrival to its answer.
class HttpExchange {
 public:
  // Valid until Answer().
  const HttpRequest& request() const { return request_; }
  // Whether the client has gone: nobody will read the answer. Any thread.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // Sends `answer`: exactly once, from any thread. The exchange may be gone
  // when this returns.
  void Answer(HttpAnswer answer);

 private:
  friend class HttpTransportLoop;
  HttpExchange(HttpTransportLoop& loop, uint64_t connection) : loop_(loop), connection_(connection) {}

  HttpTransportLoop& loop_;
  const uint64_t connection_;
  HttpRequest request_;
  HttpAnswer answer_;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> answered_{false};
};

class HttpHandler {
 public:
  // On the connection thread, once a request's head has arrived and before
  // any of its body is read: an answer to send at once, or nullopt to read
  // the body and Handle the request. Must not block.
  virtual std::optional<HttpAnswer> Screen(const HttpRequest& request) = 0;
  // On a worker, with the whole request: calls exchange.Answer() once, now
  // or later on any thread. If it throws before answering, the client gets a
  // 500 (Refusal's body).
  virtual void Handle(HttpExchange& exchange) = 0;
  // The answer for a request the transport itself refuses (status and why).
  virtual HttpAnswer Refusal(int status, absl::string_view message) = 0;

 protected:
  ~HttpHandler() = default;
};

class HttpTransport {
 public:
  // Listens and serves until Stop. `handler` must outlive the transport.
  static absl::StatusOr<std::unique_ptr<HttpTransport>> Start(const HttpTransportOptions& options,
                                                              HttpHandler& handler);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  int port() const;
  // Stops listening. A connection idle between requests is closed once idle
  // for half a second more (a request sent meanwhile is answered); a request
  // partly received may arrive whole until `deadline` (and its own timeout),
  // and is handled: a client that was sending when the stop began is
  // answered, not cut off. At `deadline` those still reading are closed.
  // Every answer from now on closes its connection. Waits for the
  // requests being handled to be answered and their answers written (or
  // their clients' write timeouts). Idempotent.
  void Stop(absl::Time deadline);

 private:
  explicit HttpTransport(std::unique_ptr<HttpTransportLoop> loop);
  std::unique_ptr<HttpTransportLoop> loop_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_HTTP_TRANSPORT_H_
