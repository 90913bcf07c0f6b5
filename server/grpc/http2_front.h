// The gRPC port's front door, for the limits gRPC 1.51 does not keep on its
// own connections (server/grpc/http2_stream_ledger.h: HTTP/2's rapid reset,
// streams opened past SETTINGS_MAX_CONCURRENT_STREAMS before the client
// acknowledges it) nor on their number.
//
// The front listens on the gRPC address itself. Each connection it accepts
// gets a socket pair: gRPC serves one end (handed over by `hand_over`, for
// gRPC's external connection acceptor) and one of `relay_threads` threads
// relays the bytes between the client and the other end, reading each
// frame's header on the way (a connection stays on the thread it was given;
// one thread moves about 3 GB/s, bench/RESULTS.md section 24). A connection
// that passes a limit is closed at once, which ends its calls in gRPC as a
// client's hang-up does, and is logged with its peer's address; so is the
// connection holding the most streams when all together hold more than
// `max_open_streams`. Past `max_connections` open, a new connection takes
// the place of the one with no call open that has gone longest without
// starting one (what it sends besides calls does not count), or, with none,
// is closed as it is accepted.
//
// The relay costs each byte one more copy, each request or answer two more
// system calls and a wake of a relay thread (bench/RESULTS.md section 22
// measures it), and each connection up to 2 * `buffer_bytes` while one side
// does not take what the other sends. gRPC sees every client as a local
// peer; nothing in the server asks gRPC who a client is, except for the
// certificate a TLS client presented (`ClientCertificate`).
//
// With `tls`, the front ends TLS itself (the handshake on the relay thread)
// and relays what it decrypts: gRPC serves plain HTTP/2 on its ends. With
// `name_peers`, each gRPC end is a Unix socket with a name of its own, which
// gRPC gives as the call's peer, so that the server finds which certificate
// a call's client presented.
//
// The bounds over all connections (their number, their streams together)
// are kept under one lock the relay threads take when a connection's count
// of streams changes; a thread closes a connection of another by asking it
// to, and the connection stops counting at once.
//
// Thread safety: Start, StopAccepting and Stop from one controlling thread;
// ClientCertificate from any.
#ifndef PRECOMPILE_SERVER_GRPC_HTTP2_FRONT_H_
#define PRECOMPILE_SERVER_GRPC_HTTP2_FRONT_H_

#include <openssl/ssl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/grpc/http2_stream_ledger.h"

namespace precompile::server {

struct Http2FrontOptions {
  // host:port or [host]:port; port 0 picks a free one (Http2Front::port).
  std::string address = "0.0.0.0:8001";
  int max_connections = 1024;
  // Streams open on all connections together: each costs gRPC about
  // 13-18 KiB that no quota counts, so 1024 connections each within
  // `limits` could still hold GiBs. Past it, the connection holding the most
  // is closed. 0: no limit.
  int max_open_streams = 4096;
  Http2StreamLimits limits;
  // What the relay holds of one connection in each direction, while the
  // side it goes to does not take it.
  size_t buffer_bytes = 64 << 10;
  // Threads relaying, each for its share of the connections; one of them
  // also accepts.
  int relay_threads = 1;
  // Ends TLS with this context (base/tls_server.h: ALPN "h2" for gRPC
  // clients), which must outlive the front and which Start tunes for it
  // (unexpected EOF is an end, idle connections release their buffers);
  // null: plain HTTP/2.
  SSL_CTX* tls = nullptr;
  // Gives each connection's gRPC end a name (see above).
  bool name_peers = false;
};

// What the front refused, counted for /metrics. Any thread.
struct Http2FrontStats {
  // Connections closed for passing a limit, and closed (the new one or one
  // idle) for their number.
  std::atomic<int64_t> closed_for_resets{0};
  std::atomic<int64_t> closed_for_streams{0};
  std::atomic<int64_t> refused_connections{0};
};

class Http2Front {
 public:
  // Gives gRPC its end of a new connection; gRPC owns the descriptor after.
  using HandOver = std::function<void(int fd)>;

  // Listens and relays until Stop, counting into `stats`, which must
  // outlive the front.
  static absl::StatusOr<std::unique_ptr<Http2Front>> Start(const Http2FrontOptions& options,
                                                           HandOver hand_over,
                                                           Http2FrontStats& stats);
  ~Http2Front();
  Http2Front(const Http2Front&) = delete;
  Http2Front& operator=(const Http2Front&) = delete;

  int port() const { return port_; }
  // The certificate (PEM, as base/tls_server.h writes it) that the client
  // of the connection gRPC names `grpc_peer` presented; empty if none, or
  // the connection is gone.
  std::string ClientCertificate(absl::string_view grpc_peer) const;
  int relay_threads() const { return static_cast<int>(shards_.size()); }
  // Closes the listening socket: new connections are refused from now on.
  void StopAccepting();
  // Tells each client to open no more calls on its connection, as HTTP/2's
  // graceful shutdown does: a GOAWAY that lets every stream it has opened
  // go on (last stream 2^31-1, NO_ERROR), then a PING. Its calls go on.
  // gRPC's own shutdown cancels the calls it has received that the server
  // has not taken yet (the client sees CANCELLED, not a retryable
  // UNAVAILABLE); once a client has acknowledged the PING, every call it
  // sent before reading the GOAWAY has arrived, and once those have ended
  // gRPC has none of its calls left to cancel. Once; with StopAccepting
  // first.
  void GoAway();
  // Waits until `deadline` for every connection that GoAway told to have
  // acknowledged the PING with none of its calls open, or to have closed.
  // Says whether all did.
  bool AwaitGoneAway(absl::Time deadline);
  // Stops accepting, waits until `deadline` for the connections gRPC has
  // ended to be written out to their clients, then closes every connection.
  // Idempotent.
  void Stop(absl::Time deadline);

 private:
  struct Connection;
  struct Shard;
  struct Shared;

  Http2Front(const Http2FrontOptions& options, HandOver hand_over, Http2FrontStats& stats,
             int listener, int port);
  void Run(Shard& shard);
  // Has the accepting shard's epoll report connections waiting on the
  // listener (tagged nullptr).
  bool WatchListener();
  void Accept(Shard& shard);
  // Takes the connections given to `shard` and closes those it was asked to.
  void TakeArrivals(Shard& shard);
  // Moves what it can between the connection's two sockets; closes the
  // connection once both directions have ended, or at once if it passed a
  // limit or a socket failed.
  void Pump(Shard& shard, Connection& connection);
  template <typename ClientEnd>
  void Relay(Shard& shard, Connection& connection, ClientEnd& client);
  // Takes a TLS connection's handshake as far as its sockets allow; false
  // if it is not through yet (or failed, and the connection is closed).
  bool Handshake(Shard& shard, Connection& connection);
  // The gRPC end of a new connection and the front's, as socket pairs are;
  // with `name_peers`, named `peer_names_` plus `id`.
  bool MakeEnds(uint64_t id, int ends[2]);
  // Counts `connection`'s streams in the total after `read` fed its ledger;
  // past max_open_streams, closes the connections holding the most until it
  // is within. False if `connection` itself was the one to go (or another
  // thread had closed it meanwhile).
  template <typename Read>
  bool CountStreams(Shard& shard, Connection& connection, Read read);
  // Counts `connection`'s closure by the limit it passed (`why`), logs
  // `reason` (within the log budget), and closes it.
  void CloseFor(Shard& shard, Connection& connection, Http2StreamLedger::Breach why,
                absl::string_view reason);
  void Close(Shard& shard, Connection& connection);
  // GoAway for one connection: writes its frames once the bytes from gRPC
  // end between frames and the client's pipe has room for them; notes when
  // the client has acknowledged with none of its calls open.
  void GoAwayFrames(Connection& connection);
  void SettleGoingAway(Connection& connection);
  // Marks `connections` (the shard's) to be told by GoAway and counts them
  // awaited; `shard_seen`: the shard has now told all it had.
  void TellToGoAway(Shard& shard, const std::vector<Connection*>& connections, bool shard_seen);

  const Http2FrontOptions options_;
  const HandOver hand_over_;
  Http2FrontStats& stats_;
  int listener_;
  const int port_;
  // name_peers: what the gRPC ends connect to, and the start of their names.
  int peer_listener_ = -1;
  std::string peer_names_;
  uint64_t next_connection_id_ = 0;  // The accepting thread's.
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<Shared> shared_;
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> going_away_{false};
  std::atomic<int64_t> stop_deadline_ns_{0};
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_HTTP2_FRONT_H_
