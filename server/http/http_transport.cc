#include "server/http/http_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/listen_socket.h"
#include "base/log_text.h"
#include "base/tls_server.h"

namespace precompile::server {
namespace {

constexpr size_t kReadChunk = 64 << 10;
// Pieces of an answer (its head, its JSON, each output) sent by one sendmsg.
constexpr int kWritePieces = 16;
// What one connection may read in one turn of the loop before the others get
// theirs.
constexpr size_t kReadPerTurn = 4 << 20;
// How often deadlines are checked.
constexpr absl::Duration kTick = absl::Milliseconds(200);
// How long a connection idle between requests when the stop begins stays
// open: a busy keep-alive client's next request comes well within it.
constexpr absl::Duration kIdleAtStop = absl::Milliseconds(500);
// After an answer that closes the connection, how long and how much of what
// the client still sends is read and dropped, so that the close does not
// reset the connection before the client has read the answer.
constexpr absl::Duration kLingerTime = absl::Seconds(2);
constexpr size_t kLingerBytes = 4 << 20;
// A body's time to arrive, on top of request_timeout: a second per MiB.
constexpr size_t kBodyBytesPerSecond = 1 << 20;
// epoll ids that are not connections.
constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

}  // namespace

class HttpTransportLoop {
 public:
  HttpTransportLoop(const HttpTransportOptions& options, HttpHandler& handler)
      : options_(options), handler_(handler) {}
  ~HttpTransportLoop() {
    Stop(absl::Now());
    if (listen_fd_ >= 0) close(listen_fd_);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  absl::Status Open();
  int port() const { return port_; }
  void Stop(absl::Time deadline);
  // From HttpExchange::Answer, on any thread.
  void Post(HttpExchange* exchange);

 private:
  enum class State {
    kHandshake,  // TLS: the handshake has not finished
    kHead,       // reading a head, or idle between requests
    kBody,       // reading a body
    kHandled,    // a worker or a job has the request
    kWriting,    // writing an answer
    kLingering,  // answered, closing: reading and dropping what still comes
  };

  struct Connection {
    uint64_t id = 0;
    int fd = -1;
    std::unique_ptr<SSL, SslFree> ssl;
    // The certificate the client presented in the handshake, in PEM; empty
    // without one.
    std::string client_certificate_pem;
    State state = State::kHead;
    // Bytes read that no request has taken yet.
    std::string in;
    // The request being read, handled or answered; shared with the worker
    // that handles it until Handle returns.
    std::shared_ptr<HttpExchange> exchange;
    uint64_t body_length = 0;
    // This request's share of body_bytes_.
    size_t reserved = 0;
    // The answer's share of answer_bytes_, until it is written or dropped.
    size_t answer_held = 0;
    bool head_only = false;
    bool keep_alive = true;
    // Some of the request being read has arrived.
    bool request_started = false;
    // Bytes to write: an answer, or 100 Continue. Its pieces may borrow a
    // model's outputs (HttpAnswer::body) until the socket first fills.
    absl::Cord out;
    // `out` owns all its bytes: copied out of what it borrowed.
    bool out_owned = false;
    bool close_after_write = false;
    // TLS: the last read wants the socket writable, or the last write wants
    // it readable.
    bool tls_wants_other = false;
    absl::Time deadline;
    // When it connected or last finished an answer: the idle longest go
    // first when connections run out.
    absl::Time idle_since;
    size_t lingered = 0;
    uint32_t events = 0;
    bool dead = false;
  };

  void Run();
  void Wake();
  void Accept();
  bool EvictOne();
  void BeginStop();
  void OnEvent(Connection& c, uint32_t events);
  void Handshake(Connection& c);
  void ReadRequest(Connection& c);
  void Advance(Connection& c);
  void StartRequest(Connection& c, HttpHead head);
  void Dispatch(Connection& c);
  void Refuse(Connection& c, int status, absl::string_view message);
  void Send(Connection& c, HttpAnswer answer);
  void Flush(Connection& c);
  // The socket is full: what is left of the answer is copied out of the
  // tensors it borrows.
  void OwnWhatWaits(Connection& c);
  void FinishAnswer(Connection& c);
  void StartLinger(Connection& c);
  void Linger(Connection& c);
  void Drop(Connection& c);
  // Ends the request a connection holds: its body's share of the budget
  // goes back, and the exchange with it.
  void EndRequest(Connection& c);
  // The answer's share of the budget goes back: written, or dropped.
  void ReleaseAnswer(Connection& c);
  // Marks a closed connection for erasure at the end of the loop's turn.
  void Bury(Connection& c);
  // epoll_ctl with `op` for `fd`, reported as `id` on `events`.
  bool Watch(int op, int fd, uint64_t id, uint32_t events);
  static bool Reading(const Connection& c) {
    return c.state == State::kHead || c.state == State::kBody;
  }
  void UpdateEvents(Connection& c);
  void TakeAnswers();
  void RunReady();
  void Sweep(absl::Time now);
  void OnTimeout(Connection& c);
  Connection* Find(uint64_t id);
  void Work();

  const HttpTransportOptions options_;
  HttpHandler& handler_;
  std::unique_ptr<SSL_CTX, SslCtxFree> tls_;
  DescriptorShare descriptors_;
  int max_connections_ = 0;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int port_ = 0;
  bool listener_paused_ = false;
  std::atomic<bool> stopping_{false};
  // Until when requests partly received at the stop may arrive whole.
  std::atomic<int64_t> stop_deadline_ns_{0};
  std::thread loop_thread_;

  // The loop thread's alone.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Connection>> connections_;
  uint64_t next_id_ = kWakeId + 1;
  size_t body_bytes_ = 0;
  // Bytes of answers not yet written whole: a client that does not read
  // leaves its answer here, beyond what the kernel's buffers take.
  size_t answer_bytes_ = 0;
  // Connections with bytes read (or, for TLS, decrypted) that no event will
  // announce again.
  std::vector<uint64_t> ready_;
  std::vector<uint64_t> dead_;

  std::mutex answered_mu_;
  std::vector<HttpExchange*> answered_ ABSL_GUARDED_BY(answered_mu_);

  std::mutex work_mu_;
  std::condition_variable work_ready_;
  std::deque<std::shared_ptr<HttpExchange>> work_ ABSL_GUARDED_BY(work_mu_);
  bool workers_stop_ ABSL_GUARDED_BY(work_mu_) = false;
  std::vector<std::thread> workers_;
};

void HttpExchange::Answer(HttpAnswer answer) {
  if (answered_.exchange(true)) {
    spdlog::error("event=http_answered_twice");
    return;
  }
  answer_ = std::move(answer);
  loop_.Post(this);
}

absl::Status HttpTransportLoop::Open() {
  if (!options_.tls_cert_file.empty()) {
    auto tls = MakeTlsServerContext(
        {options_.tls_cert_file, options_.tls_key_file, options_.tls_client_ca_file}, "HTTPS",
        /*require_client_certificate=*/false);
    if (!tls.ok()) return tls.status();
    tls_ = *std::move(tls);
  }
  // A client that goes while its answer is written must not end the
  // process: OpenSSL writes to sockets with write(), which raises SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  descriptors_ = DescriptorShare::Reserve(options_.max_connections, 1);
  max_connections_ = descriptors_.connections();
  if (max_connections_ < options_.max_connections) {
    spdlog::warn("event=http_connections_limited wanted={} allowed={} reason=\"the process's "
                 "descriptor limit (ulimit -n)\"",
                 options_.max_connections, max_connections_);
  }
  auto listening = ListenTcp(options_.address, "HTTP");
  if (!listening.ok()) return listening.status();
  std::tie(listen_fd_, port_) = *listening;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return absl::InternalError("cannot make the HTTP event loop");
  if (!Watch(EPOLL_CTL_ADD, listen_fd_, kListenerId, EPOLLIN) ||
      !Watch(EPOLL_CTL_ADD, wake_fd_, kWakeId, EPOLLIN)) {
    return absl::InternalError("cannot make the HTTP event loop");
  }
  for (int i = 0; i < std::max(options_.workers, 1); ++i) workers_.emplace_back([this] { Work(); });
  loop_thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void HttpTransportLoop::Stop(absl::Time deadline) {
  if (loop_thread_.joinable()) {
    stop_deadline_ns_ = absl::ToUnixNanos(deadline);
    stopping_ = true;
    Wake();
    loop_thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    workers_stop_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

void HttpTransportLoop::Wake() {
  const uint64_t one = 1;
  // A full counter already wakes the loop.
  [[maybe_unused]] ssize_t written = write(wake_fd_, &one, sizeof one);
}

void HttpTransportLoop::Post(HttpExchange* exchange) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(answered_mu_);
    answered_.push_back(exchange);
    first = answered_.size() == 1;
  }
  // The loop takes all answers at once after each wake: the one that found
  // none waiting has woken it (or is about to), and it takes this one too.
  if (first) Wake();
}

void HttpTransportLoop::Work() {
  while (true) {
    std::shared_ptr<HttpExchange> exchange;
    {
      std::unique_lock<std::mutex> lock(work_mu_);
      work_ready_.wait(lock, [this] { return workers_stop_ || !work_.empty(); });
      if (work_.empty()) return;
      exchange = std::move(work_.front());
      work_.pop_front();
    }
    try {
      handler_.Handle(*exchange);
    } catch (...) {
      const CaughtException caught = DescribeCaughtException();
      spdlog::error("event=http_handler_threw what=\"{}\"", caught.what);
      if (!exchange->answered_.load()) {
        exchange->Answer(handler_.Refusal(
            caught.out_of_memory ? 503 : 500,
            caught.out_of_memory ? "the server ran out of memory answering this request"
                                 : "the server failed while answering this request (an "
                                   "internal error; the server's log has it)"));
      }
    }
  }
}

void HttpTransportLoop::Run() {
  constexpr int kEvents = 128;
  epoll_event events[kEvents];
  absl::Time next_sweep = absl::Now() + kTick;
  bool stop_begun = false;
  while (true) {
    if (stopping_.load() && !stop_begun) {
      stop_begun = true;
      BeginStop();
    }
    if (stop_begun && connections_.empty()) break;
    const int timeout_ms = ready_.empty() ? static_cast<int>(absl::ToInt64Milliseconds(kTick)) : 0;
    const int n = epoll_wait(epoll_fd_, events, kEvents, timeout_ms);
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenerId) {
        Accept();
      } else if (id == kWakeId) {
        uint64_t count;
        [[maybe_unused]] ssize_t got = read(wake_fd_, &count, sizeof count);
      } else if (Connection* c = Find(id); c != nullptr && c->fd >= 0) {
        OnEvent(*c, events[i].events);
      }
    }
    TakeAnswers();
    RunReady();
    const absl::Time now = absl::Now();
    if (now >= next_sweep) {
      Sweep(now);
      next_sweep = now + kTick;
    }
    if (stop_begun && now >= absl::FromUnixNanos(stop_deadline_ns_.load())) {
      for (auto& [id, c] : connections_) {
        if (!c->dead && c->fd >= 0 && (Reading(*c) || c->state == State::kHandshake)) Drop(*c);
      }
    }
    for (uint64_t id : dead_) connections_.erase(id);
    dead_.clear();
  }
}

HttpTransportLoop::Connection* HttpTransportLoop::Find(uint64_t id) {
  auto it = connections_.find(id);
  return it == connections_.end() || it->second->dead ? nullptr : it->second.get();
}

void HttpTransportLoop::Accept() {
  while (listen_fd_ >= 0) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room, or stop watching the listener for a
        // tick (it would wake the loop for ever).
        if (!EvictOne()) {
          epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
          listener_paused_ = true;
        }
      }
      return;
    }
    if (connections_.size() - dead_.size() >= static_cast<size_t>(max_connections_) &&
        !EvictOne()) {
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto c = std::make_unique<Connection>();
    c->id = next_id_++;
    c->fd = fd;
    const absl::Time now = absl::Now();
    c->deadline = now + options_.request_timeout;
    c->idle_since = now;
    if (tls_ != nullptr) {
      SSL* ssl = SSL_new(tls_.get());
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        SSL_free(ssl);
        close(fd);
        continue;
      }
      SSL_set_accept_state(ssl);
      c->ssl.reset(ssl);
      c->state = State::kHandshake;
    }
    c->events = EPOLLIN | EPOLLRDHUP;
    if (!Watch(EPOLL_CTL_ADD, fd, c->id, c->events)) {
      c->ssl.reset();
      close(fd);
      continue;
    }
    connections_.emplace(c->id, std::move(c));
  }
}

bool HttpTransportLoop::EvictOne() {
  // Lingering ones first (already answered), then those idle longest
  // between requests or before their first byte, then those that have sent
  // part of a head for longest. Bodies being sent and requests being
  // handled are never evicted.
  Connection* chosen = nullptr;
  int chosen_rank = 3;
  for (auto& [id, c] : connections_) {
    if (c->dead || c->fd < 0) continue;
    int rank = 3;
    if (c->state == State::kLingering) {
      rank = 0;
    } else if ((c->state == State::kHead || c->state == State::kHandshake) &&
               !c->request_started) {
      rank = 1;
    } else if (c->state == State::kHead) {
      rank = 2;
    }
    if (rank < chosen_rank || (rank == chosen_rank && rank < 3 && c->idle_since < chosen->idle_since)) {
      chosen = c.get();
      chosen_rank = rank;
    }
  }
  if (chosen == nullptr) return false;
  Drop(*chosen);
  return true;
}

void HttpTransportLoop::BeginStop() {
  if (listen_fd_ >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
    close(listen_fd_);
    listen_fd_ = -1;
  }
  // A connection idle between requests is closed once idle for kIdleAtStop
  // (by the stop's deadline): a client that sends its next request meanwhile
  // is answered (and the answer closes the connection) rather than finding
  // the connection closed under the request it has just sent.
  const absl::Time now = absl::Now();
  const absl::Time close_idle_at =
      std::min(now + kIdleAtStop, absl::FromUnixNanos(stop_deadline_ns_.load()));
  for (auto& [id, c] : connections_) {
    if (c->dead || c->fd < 0) continue;
    switch (c->state) {
      case State::kHandshake:
        Drop(*c);
        break;
      case State::kHead:
        if (!c->request_started) {
          if (close_idle_at <= now) {
            Drop(*c);
          } else {
            c->deadline = std::min(c->deadline, close_idle_at);
          }
        }
        // One partly received goes on arriving (until the stop's deadline)
        // and is answered.
        break;
      case State::kBody:
        break;
      case State::kHandled:
      case State::kWriting: c->close_after_write = true; break;
      case State::kLingering: break;
    }
  }
}

void HttpTransportLoop::OnEvent(Connection& c, uint32_t events) {
  switch (c.state) {
    case State::kHandshake: return Handshake(c);
    case State::kHead:
    case State::kBody:
      if (!c.out.empty() && (events & EPOLLOUT)) {
        Flush(c);
        if (c.fd < 0) return;
      }
      if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) ReadRequest(c);
      return;
    case State::kHandled:
      // The client has gone while its request is handled.
      if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) return Drop(c);
      // A pipelined request, read once this one is answered.
      if ((events & EPOLLIN) && Watch(EPOLL_CTL_MOD, c.fd, c.id, EPOLLRDHUP)) c.events = EPOLLRDHUP;
      return;
    case State::kWriting: return Flush(c);
    case State::kLingering: return Linger(c);
  }
}

void HttpTransportLoop::Handshake(Connection& c) {
  ERR_clear_error();
  const int done = SSL_do_handshake(c.ssl.get());
  if (done == 1) {
    c.client_certificate_pem = PeerCertificatePem(c.ssl.get());
    c.state = State::kHead;
    c.tls_wants_other = false;
    c.deadline = absl::Now() + options_.request_timeout;
    UpdateEvents(c);
    ready_.push_back(c.id);
    return;
  }
  const int error = SSL_get_error(c.ssl.get(), done);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
    c.tls_wants_other = error == SSL_ERROR_WANT_WRITE;
    UpdateEvents(c);
    return;
  }
  // Not TLS (plain HTTP on an HTTPS port), or a certificate its CA did not sign.
  Drop(c);
}

void HttpTransportLoop::ReadRequest(Connection& c) {
  char buffer[kReadChunk];
  size_t total = 0;
  while (c.fd >= 0 && Reading(c)) {
    if (total >= kReadPerTurn) {
      ready_.push_back(c.id);
      break;
    }
    // No more than the body still needs: bytes past it (a pipelined request)
    // wait in the socket, not in this process, until the answer is sent.
    size_t want = sizeof buffer;
    if (c.state == State::kBody) {
      want = std::min<size_t>(want, c.body_length - c.exchange->request_.body.size());
      if (want == 0) break;
    }
    size_t n = 0;
    if (c.ssl != nullptr) {
      ERR_clear_error();
      const int got = SSL_read(c.ssl.get(), buffer, static_cast<int>(want));
      if (got <= 0) {
        const int error = SSL_get_error(c.ssl.get(), got);
        if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) return Drop(c);
        c.tls_wants_other = error == SSL_ERROR_WANT_WRITE;
        break;
      }
      n = static_cast<size_t>(got);
    } else {
      const ssize_t got = recv(c.fd, buffer, want, 0);
      if (got == 0) return Drop(c);
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        return Drop(c);
      }
      n = static_cast<size_t>(got);
    }
    total += n;
    (c.state == State::kBody ? c.exchange->request_.body : c.in).append(buffer, n);
    Advance(c);
  }
  if (c.fd >= 0) UpdateEvents(c);
}

void HttpTransportLoop::Advance(Connection& c) {
  if (c.state == State::kHead) {
    c.in.erase(0, SkipEmptyLines(c.in));
    if (c.in.empty()) return;
    if (!c.request_started) {
      c.request_started = true;
      c.deadline = absl::Now() + options_.request_timeout;
    }
    const absl::string_view window =
        absl::string_view(c.in).substr(0, options_.max_head_bytes);
    const std::optional<size_t> end = FindHeadEnd(window);
    if (!end) {
      if (c.in.size() >= options_.max_head_bytes) {
        Refuse(c, 431,
               absl::StrCat("the request's head (request line and header fields) is more than "
                            "the server's limit of ",
                            options_.max_head_bytes, " bytes"));
      }
      return;
    }
    absl::StatusOr<HttpHead> head = ParseHttpHead(window.substr(0, *end), options_.max_fields);
    c.in.erase(0, *end);
    if (!head.ok()) {
      const absl::StatusCode code = head.status().code();
      const int status = code == absl::StatusCode::kResourceExhausted ? 431
                         : code == absl::StatusCode::kUnimplemented   ? 505
                                                                      : 400;
      return Refuse(c, status, head.status().message());
    }
    StartRequest(c, *std::move(head));
  }
  if (c.state == State::kBody) {
    std::string& body = c.exchange->request_.body;
    const size_t take = std::min<size_t>(c.in.size(), c.body_length - body.size());
    body.append(c.in, 0, take);
    c.in.erase(0, take);
    if (body.size() == c.body_length) Dispatch(c);
  }
}

void HttpTransportLoop::StartRequest(Connection& c, HttpHead head) {
  c.exchange.reset(new HttpExchange(*this, c.id));
  HttpRequest& request = c.exchange->request_;
  request.head = std::move(head);
  request.client_certificate_pem = c.client_certificate_pem;
  c.keep_alive = request.head.keep_alive;
  c.head_only = request.head.method == "HEAD";
  if (c.head_only) request.head.method = "GET";
  const uint64_t length = request.head.content_length.value_or(0);
  if (request.head.transfer_encoding) {
    return Refuse(c, 411,
                  "send the body with a Content-Length: a chunked body's size is known only once "
                  "it is read, and this server refuses bodies over its limit unread");
  }
  if (length > options_.max_body_bytes) {
    return Refuse(c, 413,
                  absl::StrCat("the request body is ", length,
                               " bytes, more than the server's limit of ", options_.max_body_bytes,
                               " bytes (", options_.max_body_flag, ")"));
  }
  std::optional<HttpAnswer> screened;
  try {
    screened = handler_.Screen(request);
  } catch (...) {
    spdlog::error("event=http_screen_threw what=\"{}\"", DescribeCaughtException().what);
    return Refuse(c, 500, "the server failed while reading this request's head");
  }
  if (screened) {
    // The body, if any, is not read: it must not be taken for a request.
    c.close_after_write |= length > 0;
    c.exchange.reset();
    return Send(c, *std::move(screened));
  }
  if (body_bytes_ + answer_bytes_ + length > options_.max_body_buffer_bytes) {
    return Refuse(c, 429,
                  absl::StrCat("the server holds as many bytes of request bodies and unsent "
                               "answers as it may (",
                               options_.max_body_buffer_bytes,
                               "); retry when the requests before yours are answered"));
  }
  c.reserved = length;
  body_bytes_ += length;
  c.body_length = length;
  request.body.reserve(length);
  c.state = State::kBody;
  c.deadline = absl::Now() + options_.request_timeout +
               absl::Seconds(static_cast<double>(length) / kBodyBytesPerSecond);
  if (length > 0 && request.head.expect_continue) {
    c.out.Append("HTTP/1.1 100 Continue\r\n\r\n");
    Flush(c);
  }
}

void HttpTransportLoop::Dispatch(Connection& c) {
  c.state = State::kHandled;
  c.deadline = absl::InfiniteFuture();
  UpdateEvents(c);
  {
    std::lock_guard<std::mutex> lock(work_mu_);
    work_.push_back(c.exchange);
  }
  work_ready_.notify_one();
}

void HttpTransportLoop::Refuse(Connection& c, int status, absl::string_view message) {
  // The request is malformed, over a limit, or late: what follows on the
  // connection cannot be trusted to start a request.
  c.close_after_write = true;
  EndRequest(c);
  Send(c, handler_.Refusal(status, message));
}

void HttpTransportLoop::Send(Connection& c, HttpAnswer answer) {
  if (!c.keep_alive || stopping_.load()) c.close_after_write = true;
  std::string head = absl::StrCat("HTTP/1.1 ", answer.status, " ", ReasonPhrase(answer.status),
                                  "\r\nContent-Length: ", answer.body.size(), "\r\n");
  if (!answer.content_type.empty()) absl::StrAppend(&head, "Content-Type: ", answer.content_type, "\r\n");
  for (const auto& [name, value] : answer.fields) absl::StrAppend(&head, name, ": ", value, "\r\n");
  if (c.close_after_write) head += "Connection: close\r\n";
  head += "\r\n";
  ReleaseAnswer(c);
  c.answer_held = head.size();
  c.out.Append(std::move(head));
  if (!c.head_only && !answer.body.empty()) {
    c.answer_held += answer.body.size();
    c.out.Append(std::move(answer.body));
    c.out_owned = false;
  }
  answer_bytes_ += c.answer_held;
  c.state = State::kWriting;
  c.deadline = absl::Now() + options_.request_timeout;
  Flush(c);
}

void HttpTransportLoop::Flush(Connection& c) {
  while (!c.out.empty()) {
    size_t n = 0;
    if (c.ssl != nullptr) {
      // One piece a call: a retried SSL_write must be given at least what
      // the failed one was, which the first piece is (it only grows).
      const absl::string_view front = *c.out.Chunks().begin();
      ERR_clear_error();
      const int put = SSL_write(
          c.ssl.get(), front.data(),
          static_cast<int>(std::min<size_t>(front.size(), std::numeric_limits<int>::max())));
      if (put <= 0) {
        const int error = SSL_get_error(c.ssl.get(), put);
        if (error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE) return Drop(c);
        c.tls_wants_other = error == SSL_ERROR_WANT_READ;
        OwnWhatWaits(c);
        return UpdateEvents(c);
      }
      n = static_cast<size_t>(put);
    } else {
      iovec pieces[kWritePieces];
      msghdr message{};
      message.msg_iov = pieces;
      for (absl::string_view chunk : c.out.Chunks()) {
        pieces[message.msg_iovlen++] = {const_cast<char*>(chunk.data()), chunk.size()};
        if (message.msg_iovlen == kWritePieces) break;
      }
      const ssize_t put = sendmsg(c.fd, &message, MSG_NOSIGNAL);
      if (put < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Drop(c);
        if (errno != EINTR) OwnWhatWaits(c);
        return UpdateEvents(c);
      }
      n = static_cast<size_t>(put);
    }
    if (c.state == State::kWriting) c.deadline = absl::Now() + options_.request_timeout;
    c.out.RemovePrefix(n);
  }
  c.tls_wants_other = false;
  c.out_owned = false;
  if (c.state == State::kWriting) return FinishAnswer(c);
  UpdateEvents(c);
}

void HttpTransportLoop::OwnWhatWaits(Connection& c) {
  if (c.out_owned || c.out.empty()) return;
  // One copy, and only for a client that does not keep up: the tensors go
  // back to the model calls' memory (--max_inference_memory_bytes counts
  // them while anything holds them), and what waits counts only against
  // max_body_buffer_bytes, as answer_held already does.
  c.out = absl::Cord(std::string(c.out));
  c.out_owned = true;
}

void HttpTransportLoop::FinishAnswer(Connection& c) {
  ReleaseAnswer(c);
  EndRequest(c);
  if (c.close_after_write) return StartLinger(c);
  c.state = State::kHead;
  c.request_started = false;
  // A refusal of the next head comes before StartRequest sets it again.
  c.head_only = false;
  const absl::Time now = absl::Now();
  c.idle_since = now;
  c.deadline = now + options_.request_timeout;
  UpdateEvents(c);
  // A pipelined request may be in `in` already, or decrypted in the TLS
  // buffer, where no event announces it.
  ready_.push_back(c.id);
}

void HttpTransportLoop::StartLinger(Connection& c) {
  if (c.ssl != nullptr) {
    ERR_clear_error();
    SSL_shutdown(c.ssl.get());
  }
  shutdown(c.fd, SHUT_WR);
  c.state = State::kLingering;
  c.deadline = absl::Now() + std::min(kLingerTime, options_.request_timeout);
  c.lingered = 0;
  UpdateEvents(c);
}

void HttpTransportLoop::Linger(Connection& c) {
  char buffer[kReadChunk];
  while (true) {
    // Raw bytes, TLS or not: they are dropped.
    const ssize_t got = recv(c.fd, buffer, sizeof buffer, 0);
    if (got > 0) {
      c.lingered += static_cast<size_t>(got);
      if (c.lingered > kLingerBytes) return Drop(c);
      continue;
    }
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    return Drop(c);
  }
}

void HttpTransportLoop::Drop(Connection& c) {
  if (c.dead) return;
  ReleaseAnswer(c);
  if (c.fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    c.ssl.reset();
    close(c.fd);
    c.fd = -1;
  }
  if (c.state == State::kHandled) {
    // Kept until the answer comes back: the handler still reads the request.
    c.exchange->cancelled_ = true;
    return;
  }
  EndRequest(c);
  Bury(c);
}

void HttpTransportLoop::EndRequest(Connection& c) {
  body_bytes_ -= c.reserved;
  c.reserved = 0;
  c.exchange.reset();
}

void HttpTransportLoop::ReleaseAnswer(Connection& c) {
  answer_bytes_ -= c.answer_held;
  c.answer_held = 0;
}

void HttpTransportLoop::Bury(Connection& c) {
  c.dead = true;
  dead_.push_back(c.id);
}

bool HttpTransportLoop::Watch(int op, int fd, uint64_t id, uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = id;
  return epoll_ctl(epoll_fd_, op, fd, &event) == 0;
}

void HttpTransportLoop::UpdateEvents(Connection& c) {
  if (c.fd < 0) return;
  uint32_t want = 0;
  switch (c.state) {
    case State::kHandshake: want = c.tls_wants_other ? EPOLLOUT : EPOLLIN; break;
    case State::kHead:
    case State::kBody:
      want = (c.tls_wants_other ? EPOLLOUT : EPOLLIN) | EPOLLRDHUP;
      if (!c.out.empty()) want |= EPOLLOUT;
      break;
    // A client waiting for its answer sends nothing, so reading stays
    // watched (two epoll_ctl calls a request fewer) until bytes come while
    // the request is handled: OnEvent then stops watching them.
    case State::kHandled:
      want = (c.events & EPOLLIN) | EPOLLRDHUP;
      break;
    case State::kWriting: want = c.tls_wants_other ? EPOLLIN : EPOLLOUT; break;
    case State::kLingering: want = EPOLLIN | EPOLLRDHUP; break;
  }
  if (want == c.events) return;
  Watch(EPOLL_CTL_MOD, c.fd, c.id, want);
  c.events = want;
}

void HttpTransportLoop::TakeAnswers() {
  std::vector<HttpExchange*> answered;
  {
    std::lock_guard<std::mutex> lock(answered_mu_);
    answered.swap(answered_);
  }
  for (HttpExchange* exchange : answered) {
    // A connection whose request is handled is never erased.
    auto it = connections_.find(exchange->connection_);
    if (it == connections_.end()) {
      spdlog::error("event=http_answer_without_connection");
      continue;
    }
    Connection& c = *it->second;
    if (c.exchange.get() != exchange) {
      spdlog::error("event=http_answer_for_another_request");
      continue;
    }
    HttpAnswer answer = std::move(exchange->answer_);
    EndRequest(c);
    if (c.fd < 0) {
      Bury(c);
      continue;
    }
    Send(c, std::move(answer));
  }
}

void HttpTransportLoop::RunReady() {
  std::vector<uint64_t> ready;
  ready.swap(ready_);
  for (uint64_t id : ready) {
    Connection* c = Find(id);
    if (c == nullptr || c->fd < 0 || !Reading(*c)) continue;
    Advance(*c);
    if (c->fd >= 0 && Reading(*c)) ReadRequest(*c);
  }
}

void HttpTransportLoop::Sweep(absl::Time now) {
  if (listener_paused_ && listen_fd_ >= 0 &&
      Watch(EPOLL_CTL_ADD, listen_fd_, kListenerId, EPOLLIN)) {
    listener_paused_ = false;
  }
  for (auto& [id, c] : connections_) {
    if (!c->dead && c->fd >= 0 && now >= c->deadline) OnTimeout(*c);
  }
}

void HttpTransportLoop::OnTimeout(Connection& c) {
  switch (c.state) {
    case State::kHead:
      if (!c.request_started) return Drop(c);  // idle between requests
      [[fallthrough]];
    case State::kBody:
      return Refuse(c, 408,
                    absl::StrCat("the request did not arrive whole within ",
                                 absl::FormatDuration(options_.request_timeout),
                                 c.state == State::kBody ? " (and a second per MiB of its body)"
                                                         : ""));
    case State::kHandshake:
    case State::kWriting:
    case State::kLingering: return Drop(c);
    case State::kHandled: return;
  }
}

HttpTransport::HttpTransport(std::unique_ptr<HttpTransportLoop> loop) : loop_(std::move(loop)) {}

HttpTransport::~HttpTransport() = default;

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Start(
    const HttpTransportOptions& options, HttpHandler& handler) {
  auto loop = std::make_unique<HttpTransportLoop>(options, handler);
  if (absl::Status s = loop->Open(); !s.ok()) return s;
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(loop)));
}

int HttpTransport::port() const { return loop_->port(); }

void HttpTransport::Stop(absl::Time deadline) { loop_->Stop(deadline); }

}  // namespace precompile::server
