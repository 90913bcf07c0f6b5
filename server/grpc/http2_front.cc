#include "server/grpc/http2_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/listen_socket.h"

namespace precompile::server {
namespace {

// What one connection may move in one turn before the others get theirs.
constexpr size_t kBytesPerTurn = 1 << 20;
// How long accepting pauses when the process is out of descriptors.
constexpr int kAcceptPauseMs = 100;

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

std::string PeerAddress(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(address);
    inet_ntop(AF_INET6, &a.sin6_addr, text, sizeof text);
    return absl::StrCat("[", text, "]:", ntohs(a.sin6_port));
  }
  const auto& a = reinterpret_cast<const sockaddr_in&>(address);
  inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return absl::StrCat(text, ":", ntohs(a.sin_port));
}

// Bytes on their way from one socket to the other that the other has not
// taken yet: [begin, end) of data, which is held only while there are such
// bytes (an idle connection costs no buffer).
struct RelayPipe {
  explicit RelayPipe(size_t capacity) : capacity(capacity) {}
  std::unique_ptr<char[]> data;
  const size_t capacity;
  size_t begin = 0;
  size_t end = 0;
  bool ended = false;  // The source has sent all it will.
  bool told = false;   // ...and the destination has been told so.
  bool empty() const { return begin == end; }
};

// At most a line a second of each kind: a flood of connections closed must
// not become a flood of log lines.
class LogBudget {
 public:
  // Whether to log now; if so, `unlogged` is how many were not since.
  bool Take(absl::Time now, int64_t& unlogged) {
    if (now - last_ < absl::Seconds(1)) {
      ++skipped_;
      return false;
    }
    last_ = now;
    unlogged = std::exchange(skipped_, 0);
    return true;
  }

 private:
  absl::Time last_ = absl::InfinitePast();
  int64_t skipped_ = 0;
};

enum class Flow { kIdle, kMoved, kFailed };

// Reads from `from` and writes to `to` once each, through `pipe` (or, while
// it is empty, through `scratch` of the pipe's capacity, keeping in the pipe
// only what `to` did not take), adding what it read to `read`. `seen` is
// shown what was read; when it says no, the flow fails.
template <typename Seen>
Flow MoveOnce(int from, int to, RelayPipe& pipe, char* scratch, size_t& read, Seen seen) {
  bool moved = false;
  if (!pipe.ended) {
    char* into = scratch;
    if (!pipe.empty()) {
      if (pipe.end == pipe.capacity && pipe.begin > 0) {
        std::memmove(pipe.data.get(), pipe.data.get() + pipe.begin, pipe.end - pipe.begin);
        pipe.end -= pipe.begin;
        pipe.begin = 0;
      }
      into = pipe.data.get() + pipe.end;
    }
    const size_t room = into == scratch ? pipe.capacity : pipe.capacity - pipe.end;
    if (room > 0) {
      const ssize_t n = recv(from, into, room, 0);
      if (n > 0) {
        const size_t got = static_cast<size_t>(n);
        if (!seen(absl::string_view(into, got))) return Flow::kFailed;
        read += got;
        moved = true;
        if (into != scratch) {
          pipe.end += got;
        } else {
          ssize_t sent = send(to, scratch, got, MSG_NOSIGNAL);
          if (sent < 0) {
            if (!WouldBlock()) return Flow::kFailed;
            sent = 0;
          }
          const size_t left = got - static_cast<size_t>(sent);
          if (left > 0) {
            pipe.data.reset(new char[pipe.capacity]);
            std::memcpy(pipe.data.get(), scratch + sent, left);
            pipe.begin = 0;
            pipe.end = left;
          }
        }
      } else if (n == 0) {
        pipe.ended = true;
        moved = true;
      } else if (!WouldBlock()) {
        return Flow::kFailed;
      }
    }
  }
  if (!pipe.empty()) {
    const ssize_t n = send(to, pipe.data.get() + pipe.begin, pipe.end - pipe.begin, MSG_NOSIGNAL);
    if (n > 0) {
      pipe.begin += static_cast<size_t>(n);
      moved = true;
      if (pipe.empty()) {
        pipe.data.reset();
        pipe.begin = pipe.end = 0;
      }
    } else if (n < 0 && !WouldBlock()) {
      return Flow::kFailed;
    }
  }
  if (pipe.ended && pipe.empty() && !pipe.told) {
    shutdown(to, SHUT_WR);
    pipe.told = true;
    moved = true;
  }
  return moved ? Flow::kMoved : Flow::kIdle;
}

}  // namespace

struct Http2Front::Connection {
  Connection(const Http2FrontOptions& options, std::string peer)
      : up(options.buffer_bytes),
        down(options.buffer_bytes),
        ledger(options.limits, absl::Now()),
        peer(std::move(peer)) {}

  int client_fd = -1;
  int grpc_fd = -1;
  RelayPipe up;    // client to gRPC
  RelayPipe down;  // gRPC to client
  Http2StreamLedger ledger;
  const std::string peer;
  bool closed = false;
  bool queued = false;  // Waits in Loop::ready for another turn.
};

// The relay thread's state.
struct Http2Front::Loop {
  absl::flat_hash_map<Connection*, std::unique_ptr<Connection>> open;
  std::deque<Connection*> ready;
  // Freed once the events that may name them are handled.
  std::vector<std::unique_ptr<Connection>> closed;
  absl::Time accept_paused_until = absl::InfinitePast();
  DescriptorShare descriptors;
  int max_connections = 0;
  // The streams open on all connections in `open`.
  int64_t open_streams = 0;
  // What a read lands in before it is written on (Http2FrontOptions::
  // buffer_bytes).
  std::unique_ptr<char[]> scratch;
  LogBudget closures_logged;
  LogBudget refusals_logged;
};

absl::StatusOr<std::unique_ptr<Http2Front>> Http2Front::Start(const Http2FrontOptions& options,
                                                              HandOver hand_over,
                                                              Http2FrontStats& stats) {
  // A client that goes while the relay writes to it must not end the process.
  signal(SIGPIPE, SIG_IGN);
  auto listening = ListenTcp(options.address, "gRPC");
  if (!listening.ok()) return listening.status();
  std::unique_ptr<Http2Front> front(
      new Http2Front(options, std::move(hand_over), stats, listening->first, listening->second));
  front->epoll_ = epoll_create1(EPOLL_CLOEXEC);
  front->wake_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.ptr = &front->wake_;
  if (front->epoll_ < 0 || front->wake_ < 0 || !front->WatchListener() ||
      epoll_ctl(front->epoll_, EPOLL_CTL_ADD, front->wake_, &wake) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot make the gRPC front's event loop: ", std::strerror(errno)));
  }
  Http2Front* raw = front.get();
  front->thread_ = std::thread([raw] { raw->Run(); });
  return front;
}

Http2Front::Http2Front(const Http2FrontOptions& options, HandOver hand_over, Http2FrontStats& stats,
                       int listener, int port)
    : options_(options),
      hand_over_(std::move(hand_over)),
      stats_(stats),
      listener_(listener),
      port_(port) {}

Http2Front::~Http2Front() {
  Stop(absl::Now());
  if (listener_ >= 0) close(listener_);
  if (wake_ >= 0) close(wake_);
  if (epoll_ >= 0) close(epoll_);
}

bool Http2Front::WatchListener() {
  // Level-triggered: a connection left in the backlog is reported again.
  epoll_event listener{};
  listener.events = EPOLLIN;
  listener.data.ptr = nullptr;
  return epoll_ctl(epoll_, EPOLL_CTL_ADD, listener_, &listener) == 0;
}

void Http2Front::Wake() {
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof one);
}

void Http2Front::StopAccepting() {
  stop_accepting_.store(true);
  Wake();
}

void Http2Front::Stop(absl::Time deadline) {
  if (!thread_.joinable()) return;
  stop_deadline_ns_.store(absl::ToUnixNanos(deadline));
  stop_accepting_.store(true);
  stopping_.store(true);
  Wake();
  thread_.join();
}

void Http2Front::Run() {
  Loop loop;
  loop.scratch.reset(new char[options_.buffer_bytes]);
  // A connection's descriptors: the client's, and both ends of its pair.
  loop.descriptors = DescriptorShare::Reserve(options_.max_connections, 3);
  loop.max_connections = loop.descriptors.connections();
  if (loop.max_connections < options_.max_connections) {
    spdlog::warn(
        "event=grpc_connections_limited wanted={} allowed={} reason=\"the process's "
        "descriptor limit (ulimit -n)\"",
        options_.max_connections, loop.max_connections);
  }
  loop_ = &loop;
  epoll_event events[256];
  for (;;) {
    const absl::Time now = absl::Now();
    if (stop_accepting_.load() && listener_ >= 0) {
      epoll_ctl(epoll_, EPOLL_CTL_DEL, listener_, nullptr);
      close(listener_);
      listener_ = -1;
    } else if (listener_ >= 0 && loop.accept_paused_until != absl::InfinitePast() &&
               now >= loop.accept_paused_until) {
      WatchListener();
      loop.accept_paused_until = absl::InfinitePast();
    }
    if (stopping_.load() &&
        (loop.open.empty() || now >= absl::FromUnixNanos(stop_deadline_ns_.load()))) {
      break;
    }
    int timeout_ms = -1;
    if (!loop.ready.empty()) {
      timeout_ms = 0;
    } else if (stopping_.load() || loop.accept_paused_until != absl::InfinitePast()) {
      timeout_ms = kAcceptPauseMs;
    }
    const int n = epoll_wait(epoll_, events, 256, timeout_ms);
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == nullptr) {
        Accept();
      } else if (tag == &wake_) {
        uint64_t count;
        (void)!read(wake_, &count, sizeof count);
      } else {
        Connection& connection = *static_cast<Connection*>(tag);
        if (!connection.closed) Pump(connection);
      }
    }
    for (size_t turns = loop.ready.size(); turns > 0; --turns) {
      Connection* connection = loop.ready.front();
      loop.ready.pop_front();
      connection->queued = false;
      if (!connection->closed) Pump(*connection);
    }
    loop.closed.clear();
  }
  std::vector<Connection*> left;
  for (auto& [connection, owned] : loop.open) left.push_back(connection);
  for (Connection* connection : left) Close(*connection);
  loop.closed.clear();
  loop_ = nullptr;
}

void Http2Front::Accept() {
  Loop& loop = *loop_;
  for (;;) {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    const int fd = accept4(listener_, reinterpret_cast<sockaddr*>(&address), &length,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The connection waits in the backlog; the listener would report it
        // again at once.
        spdlog::warn("event=grpc_accept_failed reason=\"{}\"", std::strerror(errno));
        epoll_ctl(epoll_, EPOLL_CTL_DEL, listener_, nullptr);
        loop.accept_paused_until = absl::Now() + absl::Milliseconds(kAcceptPauseMs);
      }
      return;
    }
    if (static_cast<int>(loop.open.size()) >= loop.max_connections) {
      // Room is made as the HTTP transport makes it: the connection with no
      // call open that has gone longest without starting one goes (its
      // client connects again when it has a call to make); with none, the
      // new one goes. Calls, not bytes: pings and settings cost a client
      // nothing to keep sending.
      Connection* idle = nullptr;
      for (const auto& [connection, owned] : loop.open) {
        if (connection->ledger.open_streams() == 0 &&
            (idle == nullptr || connection->ledger.last_opened() < idle->ledger.last_opened())) {
          idle = connection;
        }
      }
      stats_.refused_connections.fetch_add(1);
      if (int64_t unlogged = 0; loop.refusals_logged.Take(absl::Now(), unlogged)) {
        spdlog::warn(
            "event=grpc_connection_refused peer={} open={} unlogged_before={} "
            "reason=\"at most {} gRPC connections are open at once: {}\"",
            idle != nullptr ? idle->peer : PeerAddress(address), loop.open.size(), unlogged,
            loop.max_connections,
            idle != nullptr ? "closed the one idle longest" : "none is idle, closed the new one");
      }
      if (idle == nullptr) {
        close(fd);
        continue;
      }
      Close(*idle);
    }
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0) {
      spdlog::warn("event=grpc_accept_failed reason=\"{}\"", std::strerror(errno));
      close(fd);
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto owned = std::make_unique<Connection>(options_, PeerAddress(address));
    Connection& connection = *owned;
    connection.client_fd = fd;
    connection.grpc_fd = pair[0];
    epoll_event watch{};
    watch.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    watch.data.ptr = &connection;
    epoll_ctl(epoll_, EPOLL_CTL_ADD, connection.client_fd, &watch);
    epoll_ctl(epoll_, EPOLL_CTL_ADD, connection.grpc_fd, &watch);
    loop.open.emplace(&connection, std::move(owned));
    hand_over_(pair[1]);
  }
}

void Http2Front::Pump(Connection& connection) {
  Connection& c = connection;
  size_t moved = 0;
  for (;;) {
    absl::Status breach;
    const Flow up = MoveOnce(
        c.client_fd, c.grpc_fd, c.up, loop_->scratch.get(), moved, [&](absl::string_view bytes) {
          return CountStreams(c, [&] { breach = c.ledger.FromClient(bytes, absl::Now()); }) &&
                 breach.ok();
        });
    if (c.closed) return;  // The most streams of all connections were its.
    if (!breach.ok()) {
      CloseFor(c, c.ledger.breach(), breach.message());
      return;
    }
    const Flow down = MoveOnce(c.grpc_fd, c.client_fd, c.down, loop_->scratch.get(), moved,
                               [&](absl::string_view bytes) {
                                 return CountStreams(c, [&] { c.ledger.FromServer(bytes); });
                               });
    if (up == Flow::kFailed || down == Flow::kFailed) {
      Close(c);
      return;
    }
    // gRPC has ended the connection and all it wrote is with the client.
    if (c.down.told) {
      Close(c);
      return;
    }
    if (up == Flow::kIdle && down == Flow::kIdle) return;
    if (moved >= kBytesPerTurn) {
      // Edge-triggered: nothing reports this connection again until its
      // sockets change, so it waits for its next turn in `ready`.
      if (!c.queued) {
        c.queued = true;
        loop_->ready.push_back(&c);
      }
      return;
    }
  }
}

template <typename Read>
bool Http2Front::CountStreams(Connection& connection, Read read) {
  Loop& loop = *loop_;
  const int before = connection.ledger.open_streams();
  read();
  loop.open_streams += connection.ledger.open_streams() - before;
  const int max = options_.max_open_streams;
  while (max > 0 && loop.open_streams > max) {
    // The connection holding the most, so that a client with a few calls
    // open keeps them while one holding hundreds is cut.
    Connection* most = &connection;
    for (const auto& [other, owned] : loop.open) {
      if (other->ledger.open_streams() > most->ledger.open_streams()) most = other;
    }
    CloseFor(*most, Http2StreamLedger::Breach::kStreams,
             absl::StrCat("all gRPC connections together held more than ", max,
                          " streams (--grpc_max_open_streams); this one held the most"));
    if (most == &connection) return false;
  }
  return true;
}

void Http2Front::CloseFor(Connection& c, Http2StreamLedger::Breach why, absl::string_view reason) {
  if (why == Http2StreamLedger::Breach::kResets) stats_.closed_for_resets.fetch_add(1);
  if (why == Http2StreamLedger::Breach::kStreams) stats_.closed_for_streams.fetch_add(1);
  if (int64_t unlogged = 0; loop_->closures_logged.Take(absl::Now(), unlogged)) {
    spdlog::warn(
        "event=grpc_connection_closed peer={} open_streams={} resets={} "
        "unlogged_before={} reason=\"{}\"",
        c.peer, c.ledger.open_streams(), c.ledger.resets(), unlogged, std::string(reason));
  }
  Close(c);
}

void Http2Front::Close(Connection& connection) {
  if (connection.closed) return;
  connection.closed = true;
  loop_->open_streams -= connection.ledger.open_streams();
  // Closing our end of the pair tells gRPC the client has gone: it ends the
  // connection's calls.
  close(connection.client_fd);
  close(connection.grpc_fd);
  if (connection.queued) {
    auto& ready = loop_->ready;
    ready.erase(std::find(ready.begin(), ready.end(), &connection));
    connection.queued = false;
  }
  auto found = loop_->open.find(&connection);
  if (found != loop_->open.end()) {
    loop_->closed.push_back(std::move(found->second));
    loop_->open.erase(found);
  }
}

}  // namespace precompile::server
