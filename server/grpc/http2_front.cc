#include "server/grpc/http2_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/listen_socket.h"
#include "base/tls_server.h"

namespace precompile::server {
namespace {

// What one connection may move in one turn before the others get theirs.
constexpr size_t kBytesPerTurn = 1 << 20;
// How long accepting pauses when the process is out of descriptors.
constexpr int kAcceptPauseMs = 100;
// The opaque data of GoAway's PING: the frame's 8 bytes of payload.
constexpr absl::string_view kGoAwayPing = "goaway!!";
// With name_peers: what the gRPC ends connect to, after the front's names.
constexpr absl::string_view kPeerListenerName = "gRPC";

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
  // Moves the bytes held to the buffer's start, making room after them.
  void Compact() {
    std::memmove(data.get(), data.get() + begin, end - begin);
    end -= begin;
    begin = 0;
  }
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

// A Unix socket address in the abstract namespace (no file holds it).
struct AbstractAddress {
  explicit AbstractAddress(absl::string_view name) {
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path + 1, name.data(), name.size());
    length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  }
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&address); }
  sockaddr_un address{};
  socklen_t length;
};

enum class Flow { kIdle, kMoved, kFailed };

// One end of a relayed connection, read and written as a socket is: a
// count, 0 at the end, or -1 with errno (EAGAIN: not now).
struct SocketEnd {
  int fd;
  ssize_t Read(char* into, size_t room) { return recv(fd, into, room, 0); }
  ssize_t Write(const char* from, size_t size) { return send(fd, from, size, MSG_NOSIGNAL); }
  void EndWrites() { shutdown(fd, SHUT_WR); }
};

// The client's end over TLS. OpenSSL reads and writes whole records: a read
// may want the socket writable and a write readable, and both are retried
// on the next event of either kind (edge-triggered on both).
struct TlsEnd {
  SSL* ssl;
  int fd;
  ssize_t Read(char* into, size_t room) {
    ERR_clear_error();
    const int n = SSL_read(ssl, into, static_cast<int>(std::min<size_t>(room, 1 << 30)));
    return n > 0 ? n : Failed(n, /*end_ok=*/true);
  }
  ssize_t Write(const char* from, size_t size) {
    ERR_clear_error();
    const int n = SSL_write(ssl, from, static_cast<int>(std::min<size_t>(size, 1 << 30)));
    return n > 0 ? n : Failed(n, /*end_ok=*/false);
  }
  void EndWrites() {
    SSL_shutdown(ssl);  // close_notify, as far as the socket takes it
    shutdown(fd, SHUT_WR);
  }
  ssize_t Failed(int n, bool end_ok) {
    switch (SSL_get_error(ssl, n)) {
      case SSL_ERROR_WANT_READ:
      case SSL_ERROR_WANT_WRITE:
        errno = EAGAIN;
        return -1;
      case SSL_ERROR_ZERO_RETURN:  // close_notify, or (the context says so) a plain end
        if (end_ok) return 0;
        [[fallthrough]];
      default:
        errno = EPROTO;
        return -1;
    }
  }
};

// Reads from `from` and writes to `to` once each, through `pipe` (or, while
// it is empty, through `scratch` of the pipe's capacity, keeping in the pipe
// only what `to` did not take), adding what it read to `read`. `seen` is
// shown what was read; when it says no, the flow fails.
template <typename From, typename To, typename Seen>
Flow MoveOnce(From& from, To& to, RelayPipe& pipe, char* scratch, size_t& read, Seen seen) {
  bool moved = false;
  if (!pipe.ended) {
    // Not `into == scratch`: the end of a full pipe's buffer can be where
    // the scratch buffer starts, and a full pipe was then replaced.
    const bool into_pipe = !pipe.empty();
    char* into = scratch;
    if (into_pipe) {
      if (pipe.end == pipe.capacity && pipe.begin > 0) pipe.Compact();
      into = pipe.data.get() + pipe.end;
    }
    const size_t room = into_pipe ? pipe.capacity - pipe.end : pipe.capacity;
    if (room > 0) {
      const ssize_t n = from.Read(into, room);
      if (n > 0) {
        const size_t got = static_cast<size_t>(n);
        if (!seen(absl::string_view(into, got))) return Flow::kFailed;
        read += got;
        moved = true;
        if (into_pipe) {
          pipe.end += got;
        } else {
          ssize_t sent = to.Write(scratch, got);
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
    const ssize_t n = to.Write(pipe.data.get() + pipe.begin, pipe.end - pipe.begin);
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
    to.EndWrites();
    pipe.told = true;
    moved = true;
  }
  return moved ? Flow::kMoved : Flow::kIdle;
}

}  // namespace

struct Http2Front::Connection {
  Connection(const Http2FrontOptions& options, std::string peer, Shard& shard)
      : up(options.buffer_bytes),
        down(options.buffer_bytes),
        ledger(options.limits, absl::Now()),
        peer(std::move(peer)),
        shard(shard),
        counted_last_opened(ledger.last_opened()) {}

  // The shard's thread's alone.
  int client_fd = -1;
  int grpc_fd = -1;
  RelayPipe up;    // client to gRPC
  RelayPipe down;  // gRPC to client
  Http2StreamLedger ledger;
  const std::string peer;
  Shard& shard;
  uint64_t id = 0;
  SslConnection ssl;  // With TLS.
  bool handshaken = false;
  bool closed = false;
  bool queued = false;  // Waits in Shard::ready for another turn.
  // GoAway: its frames to be written, written, or acknowledged with no call
  // open.
  enum class GoingAway { kNo, kToWrite, kWritten, kGone } going_away = GoingAway::kNo;

  // Guarded by Shared::mu: what the bounds over all connections see of it.
  int counted_streams = 0;
  absl::Time counted_last_opened;
  // Asked to close: it no longer counts, and its shard closes it next.
  bool doomed = false;
  // Told by GoAway, and not yet gone away or closed.
  bool awaited = false;
};

// A relay thread and the connections it was given.
struct Http2Front::Shard {
  int epoll = -1;
  int wake = -1;
  std::thread thread;

  // The thread's alone.
  absl::flat_hash_map<Connection*, std::unique_ptr<Connection>> open;
  std::deque<Connection*> ready;
  // Freed once the events that may name them are handled.
  std::vector<std::unique_ptr<Connection>> closed;
  // What a read lands in before it is written on (Http2FrontOptions::
  // buffer_bytes).
  std::unique_ptr<char[]> scratch;
  absl::Time accept_paused_until = absl::InfinitePast();  // The accepting shard's.
  bool going_away = false;                                // Has seen GoAway.

  // Guarded by Shared::mu: connections given to it, and those it is asked
  // to close.
  std::vector<std::unique_ptr<Connection>> arriving;
  std::vector<Connection*> doomed;

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake, &one, sizeof one);
  }
};

// What the bounds over all connections keep.
struct Http2Front::Shared {
  std::mutex mu;
  // Every connection not yet closed by its shard, doomed ones included.
  absl::flat_hash_set<Connection*> connections;
  // GoAway: the connections told that have neither gone away nor closed,
  // and the shards that have not told theirs yet.
  int awaited = 0;
  std::condition_variable gone_away;
  // Of those not doomed: how many, and their streams together.
  int counted_connections = 0;
  int64_t open_streams = 0;
  size_t next_shard = 0;
  LogBudget closures_logged;
  LogBudget refusals_logged;
  LogBudget handshakes_logged;
  // name_peers: each connection's client certificate (PEM), by its id.
  absl::flat_hash_map<uint64_t, std::string> certificates;
  // Set before the threads start.
  DescriptorShare descriptors;
  int max_connections = 0;

  // GoAway waits for `connection` no more (gone away, or closed). Under mu.
  void StopAwaiting(Connection& connection) {
    if (!connection.awaited) return;
    connection.awaited = false;
    if (--awaited == 0) gone_away.notify_all();
  }

  // Stops counting `victim` and asks its shard to close it. Under mu.
  void Doom(Connection& victim) {
    victim.doomed = true;
    open_streams -= victim.counted_streams;
    victim.counted_streams = 0;
    --counted_connections;
    victim.shard.doomed.push_back(&victim);
    victim.shard.Wake();
  }

  // At max_connections, makes room for a new connection from `address`:
  // dooms the one idle longest, or says the new one goes. Under mu.
  bool MakeRoom(const sockaddr_storage& address, Http2FrontStats& stats) {
    if (counted_connections < max_connections) return true;
    // Room is made as the HTTP transport makes it: the connection with no
    // call open that has gone longest without starting one goes (its client
    // connects again when it has a call to make); with none, the new one goes.
    // Calls, not bytes: pings and settings cost a client nothing to keep
    // sending.
    Connection* idle = nullptr;
    for (Connection* connection : connections) {
      if (!connection->doomed && connection->counted_streams == 0 &&
          (idle == nullptr || connection->counted_last_opened < idle->counted_last_opened)) {
        idle = connection;
      }
    }
    stats.refused_connections.fetch_add(1);
    if (int64_t unlogged = 0; refusals_logged.Take(absl::Now(), unlogged)) {
      spdlog::warn(
          "event=grpc_connection_refused peer={} open={} unlogged_before={} "
          "reason=\"at most {} gRPC connections are open at once: {}\"",
          idle != nullptr ? idle->peer : PeerAddress(address), counted_connections, unlogged,
          max_connections,
          idle != nullptr ? "closed the one idle longest" : "none is idle, closed the new one");
    }
    if (idle == nullptr) return false;
    Doom(*idle);
    return true;
  }
};

absl::StatusOr<std::unique_ptr<Http2Front>> Http2Front::Start(const Http2FrontOptions& options,
                                                              HandOver hand_over,
                                                              Http2FrontStats& stats) {
  // A client that goes while the relay writes to it must not end the process.
  signal(SIGPIPE, SIG_IGN);
  if (options.tls != nullptr) {
    // A client that closes without TLS's close_notify has ended, not failed.
    SSL_CTX_set_options(options.tls, SSL_OP_IGNORE_UNEXPECTED_EOF);
    // An idle connection keeps no record buffers (about 34 KiB while in use).
    SSL_CTX_set_mode(options.tls, SSL_MODE_RELEASE_BUFFERS);
  }
  auto listening = ListenTcp(options.address, "gRPC");
  if (!listening.ok()) return listening.status();
  std::unique_ptr<Http2Front> front(
      new Http2Front(options, std::move(hand_over), stats, listening->first, listening->second));
  front->shared_ = std::make_unique<Shared>();
  Shared& shared = *front->shared_;
  // A connection's descriptors: the client's, and both ends of its pair.
  shared.descriptors = DescriptorShare::Reserve(options.max_connections, 3);
  shared.max_connections = shared.descriptors.connections();
  if (shared.max_connections < options.max_connections) {
    spdlog::warn(
        "event=grpc_connections_limited wanted={} allowed={} reason=\"the process's "
        "descriptor limit (ulimit -n)\"",
        options.max_connections, shared.max_connections);
  }
  for (int i = 0; i < std::max(1, options.relay_threads); ++i) {
    auto shard = std::make_unique<Shard>();
    shard->epoll = epoll_create1(EPOLL_CLOEXEC);
    shard->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    shard->scratch.reset(new char[options.buffer_bytes]);
    epoll_event wake{};
    wake.events = EPOLLIN;
    wake.data.ptr = &shard->wake;
    const bool made = shard->epoll >= 0 && shard->wake >= 0 &&
                      epoll_ctl(shard->epoll, EPOLL_CTL_ADD, shard->wake, &wake) == 0;
    front->shards_.push_back(std::move(shard));
    if (!made) {
      return absl::InternalError(
          absl::StrCat("cannot make the gRPC front's event loop: ", std::strerror(errno)));
    }
  }
  if (!front->WatchListener()) {
    return absl::InternalError(
        absl::StrCat("cannot make the gRPC front's event loop: ", std::strerror(errno)));
  }
  if (options.name_peers) {
    // Abstract names, which no file holds; the random part keeps another
    // process from guessing the next one before it is bound.
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce = absl::ToUnixNanos(absl::Now());
    front->peer_names_ = absl::StrCat("precompile-front-", getpid(), "-", absl::Hex(nonce), "-");
    front->peer_listener_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    AbstractAddress listener(absl::StrCat(front->peer_names_, kPeerListenerName));
    if (front->peer_listener_ < 0 ||
        bind(front->peer_listener_, listener.get(), listener.length) != 0 ||
        listen(front->peer_listener_, 64) != 0) {
      return absl::InternalError(
          absl::StrCat("cannot make the gRPC front's named ends: ", std::strerror(errno)));
    }
  }
  Http2Front* raw = front.get();
  for (auto& shard : front->shards_) {
    Shard* s = shard.get();
    shard->thread = std::thread([raw, s] { raw->Run(*s); });
  }
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
  if (peer_listener_ >= 0) close(peer_listener_);
  for (auto& shard : shards_) {
    if (shard->wake >= 0) close(shard->wake);
    if (shard->epoll >= 0) close(shard->epoll);
  }
}

bool Http2Front::WatchListener() {
  // Level-triggered: a connection left in the backlog is reported again. The
  // last shard accepts, so that with several the first connections relay on
  // others.
  epoll_event listener{};
  listener.events = EPOLLIN;
  listener.data.ptr = nullptr;
  return epoll_ctl(shards_.back()->epoll, EPOLL_CTL_ADD, listener_, &listener) == 0;
}

void Http2Front::StopAccepting() {
  stop_accepting_.store(true);
  if (!shards_.empty()) shards_.back()->Wake();
}

void Http2Front::Stop(absl::Time deadline) {
  stop_deadline_ns_.store(absl::ToUnixNanos(deadline));
  stop_accepting_.store(true);
  stopping_.store(true);
  for (auto& shard : shards_) shard->Wake();
  for (auto& shard : shards_) {
    if (shard->thread.joinable()) shard->thread.join();
  }
}

void Http2Front::Run(Shard& shard) {
  const bool accepting = &shard == shards_.back().get();
  epoll_event events[256];
  for (;;) {
    const absl::Time now = absl::Now();
    if (accepting && stop_accepting_.load() && listener_ >= 0) {
      epoll_ctl(shard.epoll, EPOLL_CTL_DEL, listener_, nullptr);
      close(listener_);
      listener_ = -1;
    } else if (accepting && listener_ >= 0 &&
               shard.accept_paused_until != absl::InfinitePast() &&
               now >= shard.accept_paused_until) {
      WatchListener();
      shard.accept_paused_until = absl::InfinitePast();
    }
    if (stopping_.load() &&
        (shard.open.empty() || now >= absl::FromUnixNanos(stop_deadline_ns_.load()))) {
      break;
    }
    int timeout_ms = -1;
    if (!shard.ready.empty()) {
      timeout_ms = 0;
    } else if (stopping_.load() || shard.accept_paused_until != absl::InfinitePast()) {
      timeout_ms = kAcceptPauseMs;
    }
    const int n = epoll_wait(shard.epoll, events, 256, timeout_ms);
    for (int i = 0; i < n; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == nullptr) {
        Accept(shard);
      } else if (tag == &shard.wake) {
        uint64_t count;
        (void)!read(shard.wake, &count, sizeof count);
      } else {
        Connection& connection = *static_cast<Connection*>(tag);
        if (!connection.closed) Pump(shard, connection);
      }
    }
    TakeArrivals(shard);
    if (!shard.going_away && going_away_.load()) {
      shard.going_away = true;
      std::vector<Connection*> told;
      for (auto& [connection, owned] : shard.open) told.push_back(connection);
      TellToGoAway(shard, told, /*shard_seen=*/true);
    }
    for (size_t turns = shard.ready.size(); turns > 0; --turns) {
      Connection* connection = shard.ready.front();
      shard.ready.pop_front();
      connection->queued = false;
      if (!connection->closed) Pump(shard, *connection);
    }
    shard.closed.clear();
  }
  // Connections given to it since are closed with the rest.
  TakeArrivals(shard);
  std::vector<Connection*> left;
  for (auto& [connection, owned] : shard.open) left.push_back(connection);
  for (Connection* connection : left) Close(shard, *connection);
  shard.closed.clear();
}

void Http2Front::TakeArrivals(Shard& shard) {
  std::vector<std::unique_ptr<Connection>> arriving;
  std::vector<Connection*> doomed;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    arriving.swap(shard.arriving);
    doomed.swap(shard.doomed);
  }
  std::vector<Connection*> told;
  for (std::unique_ptr<Connection>& owned : arriving) {
    Connection& connection = *owned;
    if (shard.going_away) told.push_back(&connection);
    shard.open.emplace(&connection, std::move(owned));
    // Edge-triggered, reported once now if either socket is ready already.
    epoll_event watch{};
    watch.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    watch.data.ptr = &connection;
    epoll_ctl(shard.epoll, EPOLL_CTL_ADD, connection.client_fd, &watch);
    epoll_ctl(shard.epoll, EPOLL_CTL_ADD, connection.grpc_fd, &watch);
  }
  if (!told.empty()) TellToGoAway(shard, told, /*shard_seen=*/false);
  // Arrivals first: a connection can be doomed before its shard took it.
  for (Connection* connection : doomed) Close(shard, *connection);
}

void Http2Front::GoAway() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (going_away_.exchange(true)) return;
    // Each shard counts until it has told its connections.
    shared_->awaited += static_cast<int>(shards_.size());
  }
  for (auto& shard : shards_) shard->Wake();
}

bool Http2Front::AwaitGoneAway(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  return shared_->gone_away.wait_until(lock, absl::ToChronoTime(deadline),
                                       [&] { return shared_->awaited == 0; });
}

void Http2Front::TellToGoAway(Shard& shard, const std::vector<Connection*>& connections,
                              bool shard_seen) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (Connection* connection : connections) {
    if (connection->closed || connection->doomed) continue;
    connection->awaited = true;
    ++shared_->awaited;
    connection->going_away = Connection::GoingAway::kToWrite;
    if (!connection->queued) {
      connection->queued = true;
      shard.ready.push_back(connection);
    }
  }
  if (shard_seen) --shared_->awaited;
  if (shared_->awaited == 0) shared_->gone_away.notify_all();
}

void Http2Front::GoAwayFrames(Connection& c) {
  RelayPipe& pipe = c.down;
  if (c.going_away != Connection::GoingAway::kToWrite || pipe.ended ||
      !c.ledger.ServerBetweenFrames()) {
    return;
  }
  // RFC 9113 sections 6.8 and 6.7: GOAWAY (the last stream, NO_ERROR) and
  // PING (its opaque data), each 8 bytes on stream 0.
  unsigned char frames[] = {0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0,
                            0, 0, 8, 0x6, 0, 0, 0, 0, 0, 0,    0,    0,    0,    0, 0, 0, 0};
  static_assert(sizeof frames == 26 + kGoAwayPing.size());
  std::memcpy(frames + 26, kGoAwayPing.data(), kGoAwayPing.size());
  if (pipe.data == nullptr) {
    pipe.data.reset(new char[pipe.capacity]);
    pipe.begin = pipe.end = 0;
  }
  if (pipe.capacity - pipe.end < sizeof frames && pipe.begin > 0) pipe.Compact();
  if (pipe.capacity - pipe.end < sizeof frames) return;  // When the client has taken more.
  std::memcpy(pipe.data.get() + pipe.end, frames, sizeof frames);
  pipe.end += sizeof frames;
  c.ledger.ExpectPingAck(kGoAwayPing);
  c.going_away = Connection::GoingAway::kWritten;
}

void Http2Front::SettleGoingAway(Connection& c) {
  if (c.going_away != Connection::GoingAway::kWritten || !c.ledger.ping_acked() ||
      c.ledger.open_streams() > 0) {
    return;
  }
  c.going_away = Connection::GoingAway::kGone;
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->StopAwaiting(c);
}

void Http2Front::Accept(Shard& shard) {
  Shared& shared = *shared_;
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
        epoll_ctl(shard.epoll, EPOLL_CTL_DEL, listener_, nullptr);
        shard.accept_paused_until = absl::Now() + absl::Milliseconds(kAcceptPauseMs);
      }
      return;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      if (!shared.MakeRoom(address, stats_)) {
        close(fd);
        continue;
      }
    }
    // Made outside the lock; only this thread adds connections, so the room
    // made stays.
    const uint64_t id = next_connection_id_++;
    int pair[2];
    if (!MakeEnds(id, pair)) {
      spdlog::warn("event=grpc_accept_failed reason=\"{}\"", std::strerror(errno));
      close(fd);
      continue;
    }
    SslConnection ssl;
    if (options_.tls != nullptr) {
      ssl.reset(SSL_new(options_.tls));
      if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) {
        spdlog::warn("event=grpc_accept_failed reason=\"cannot start TLS\"");
        for (int end : {fd, pair[0], pair[1]}) close(end);
        continue;
      }
      SSL_set_accept_state(ssl.get());
    }
    std::unique_lock<std::mutex> lock(shared.mu);
    Shard& to = *shards_[shared.next_shard++ % shards_.size()];
    auto owned = std::make_unique<Connection>(options_, PeerAddress(address), to);
    owned->client_fd = fd;
    owned->grpc_fd = pair[0];
    owned->id = id;
    owned->ssl = std::move(ssl);
    shared.connections.insert(owned.get());
    ++shared.counted_connections;
    to.arriving.push_back(std::move(owned));
    lock.unlock();
    if (&to == &shard) {
      TakeArrivals(shard);
    } else {
      to.Wake();
    }
    hand_over_(pair[1]);
  }
}

void Http2Front::Pump(Shard& shard, Connection& connection) {
  if (connection.ssl == nullptr) {
    SocketEnd client{connection.client_fd};
    Relay(shard, connection, client);
    return;
  }
  if (!connection.handshaken && !Handshake(shard, connection)) return;
  TlsEnd client{connection.ssl.get(), connection.client_fd};
  Relay(shard, connection, client);
}

bool Http2Front::Handshake(Shard& shard, Connection& c) {
  ERR_clear_error();
  const int done = SSL_do_handshake(c.ssl.get());
  if (done == 1) {
    c.handshaken = true;
    if (options_.name_peers) {
      std::string certificate = PeerCertificatePem(c.ssl.get());
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->certificates[c.id] = std::move(certificate);
    }
    return true;
  }
  const int error = SSL_get_error(c.ssl.get(), done);
  if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) return false;
  char reason[256] = "the client ended the connection";
  if (const unsigned long e = ERR_peek_last_error(); e != 0) {
    ERR_error_string_n(e, reason, sizeof reason);
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (int64_t unlogged = 0; shared_->handshakes_logged.Take(absl::Now(), unlogged)) {
      spdlog::warn("event=grpc_tls_handshake_failed peer={} unlogged_before={} reason=\"{}\"",
                   c.peer, unlogged, reason);
    }
  }
  Close(shard, c);
  return false;
}

template <typename ClientEnd>
void Http2Front::Relay(Shard& shard, Connection& connection, ClientEnd& client) {
  Connection& c = connection;
  SocketEnd grpc{c.grpc_fd};
  size_t moved = 0;
  for (;;) {
    GoAwayFrames(c);
    absl::Status breach;
    const Flow up =
        MoveOnce(client, grpc, c.up, shard.scratch.get(), moved, [&](absl::string_view bytes) {
          return CountStreams(shard, c,
                              [&] { breach = c.ledger.FromClient(bytes, absl::Now()); }) &&
                 breach.ok();
        });
    if (c.closed) return;  // The most streams of all connections were its.
    if (!breach.ok()) {
      CloseFor(shard, c, c.ledger.breach(), breach.message());
      return;
    }
    const Flow down =
        MoveOnce(grpc, client, c.down, shard.scratch.get(), moved, [&](absl::string_view bytes) {
          return CountStreams(shard, c, [&] { c.ledger.FromServer(bytes); });
        });
    if (c.closed) return;
    if (up == Flow::kFailed || down == Flow::kFailed) {
      Close(shard, c);
      return;
    }
    SettleGoingAway(c);
    if (c.going_away == Connection::GoingAway::kGone && c.down.empty()) {
      // All it was sent is with the client, which opens nothing more here:
      // gRPC's shutdown need not wait for it to hang up (clients keep such
      // a connection until they close their channel).
      Close(shard, c);
      return;
    }
    // gRPC has ended the connection and all it wrote is with the client.
    if (c.down.told) {
      Close(shard, c);
      return;
    }
    if (up == Flow::kIdle && down == Flow::kIdle) return;
    if (moved >= kBytesPerTurn) {
      // Edge-triggered: nothing reports this connection again until its
      // sockets change, so it waits for its next turn in `ready`.
      if (!c.queued) {
        c.queued = true;
        shard.ready.push_back(&c);
      }
      return;
    }
  }
}

template <typename Read>
bool Http2Front::CountStreams(Shard& shard, Connection& connection, Read read) {
  const int before = connection.ledger.open_streams();
  const absl::Time opened_before = connection.ledger.last_opened();
  read();
  // Most reads open or end no stream: the lock is taken for those that do.
  if (connection.ledger.open_streams() == before &&
      connection.ledger.last_opened() == opened_before) {
    return true;
  }
  Shared& shared = *shared_;
  std::unique_lock<std::mutex> lock(shared.mu);
  if (connection.doomed) {
    // Another thread took it to close for the bounds; it counts no more.
    lock.unlock();
    Close(shard, connection);
    return false;
  }
  const int delta = connection.ledger.open_streams() - connection.counted_streams;
  connection.counted_streams += delta;
  connection.counted_last_opened = connection.ledger.last_opened();
  shared.open_streams += delta;
  const int max = options_.max_open_streams;
  bool itself = false;
  while (max > 0 && shared.open_streams > max) {
    // The connection holding the most, so that a client with a few calls
    // open keeps them while one holding hundreds is cut.
    Connection* most = &connection;
    for (Connection* other : shared.connections) {
      if (!other->doomed && other->counted_streams > most->counted_streams) most = other;
    }
    stats_.closed_for_streams.fetch_add(1);
    if (int64_t unlogged = 0; shared.closures_logged.Take(absl::Now(), unlogged)) {
      spdlog::warn(
          "event=grpc_connection_closed peer={} open_streams={} unlogged_before={} "
          "reason=\"all gRPC connections together held more than {} streams "
          "(--grpc_max_open_streams); this one held the most\"",
          most->peer, most->counted_streams, unlogged, max);
    }
    itself = itself || most == &connection;
    shared.Doom(*most);
  }
  lock.unlock();
  if (!itself) return true;
  Close(shard, connection);
  return false;
}

void Http2Front::CloseFor(Shard& shard, Connection& c, Http2StreamLedger::Breach why,
                          absl::string_view reason) {
  if (why == Http2StreamLedger::Breach::kResets) stats_.closed_for_resets.fetch_add(1);
  if (why == Http2StreamLedger::Breach::kStreams) stats_.closed_for_streams.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (int64_t unlogged = 0; shared_->closures_logged.Take(absl::Now(), unlogged)) {
      spdlog::warn(
          "event=grpc_connection_closed peer={} open_streams={} resets={} "
          "unlogged_before={} reason=\"{}\"",
          c.peer, c.ledger.open_streams(), c.ledger.resets(), unlogged, std::string(reason));
    }
  }
  Close(shard, c);
}

void Http2Front::Close(Shard& shard, Connection& connection) {
  if (connection.closed) return;
  connection.closed = true;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->connections.erase(&connection);
    if (options_.name_peers) shared_->certificates.erase(connection.id);
    if (connection.doomed) {
      // Closed here before its shard read the request: nothing may name it.
      auto& doomed = shard.doomed;
      doomed.erase(std::remove(doomed.begin(), doomed.end(), &connection), doomed.end());
    } else {
      shared_->open_streams -= connection.counted_streams;
      --shared_->counted_connections;
    }
    shared_->StopAwaiting(connection);
  }
  // Closing our end of the pair tells gRPC the client has gone: it ends the
  // connection's calls.
  close(connection.client_fd);
  close(connection.grpc_fd);
  if (connection.queued) {
    auto& ready = shard.ready;
    ready.erase(std::find(ready.begin(), ready.end(), &connection));
    connection.queued = false;
  }
  auto found = shard.open.find(&connection);
  if (found != shard.open.end()) {
    shard.closed.push_back(std::move(found->second));
    shard.open.erase(found);
  }
}

bool Http2Front::MakeEnds(uint64_t id, int ends[2]) {
  if (!options_.name_peers) {
    return socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, ends) == 0;
  }
  const int front = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (front < 0) return false;
  AbstractAddress named(absl::StrCat(peer_names_, id));
  AbstractAddress listener(absl::StrCat(peer_names_, kPeerListenerName));
  if (bind(front, named.get(), named.length) != 0 ||
      connect(front, listener.get(), listener.length) != 0) {
    close(front);
    return false;
  }
  // Another process of the machine may connect too: only the end whose
  // peer is this name is taken.
  for (;;) {
    sockaddr_un peer{};
    socklen_t peer_length = sizeof peer;
    const int grpc = accept4(peer_listener_, reinterpret_cast<sockaddr*>(&peer), &peer_length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (grpc < 0) {
      close(front);
      return false;
    }
    if (peer_length == named.length && std::memcmp(&peer, &named.address, named.length) == 0) {
      ends[0] = front;
      ends[1] = grpc;
      return true;
    }
    close(grpc);
  }
}

std::string Http2Front::ClientCertificate(absl::string_view grpc_peer) const {
  if (!options_.name_peers) return {};
  const size_t at = grpc_peer.find(peer_names_);
  uint64_t id = 0;
  if (at == absl::string_view::npos ||
      !absl::SimpleAtoi(grpc_peer.substr(at + peer_names_.size()), &id)) {
    return {};
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  auto found = shared_->certificates.find(id);
  return found != shared_->certificates.end() ? found->second : std::string();
}

}  // namespace precompile::server
