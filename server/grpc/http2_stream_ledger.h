// What one HTTP/2 connection's frames say about its streams, read from the
// bytes each side sends (RFC 9113 frame headers only; payloads are skipped
// unread), for the limits gRPC 1.51 does not keep itself:
//   - HTTP/2's rapid reset (CVE-2023-44487): a client opens a call and
//     resets it at once, over and over. Each reset frees the stream at once
//     for HTTP/2's concurrency limit, yet each call costs the server far
//     more than its two frames cost the client: 4 connections grew the
//     server by 9.5 GiB in 20 s (bench/RESULTS.md section 21). Here a
//     connection may reset `resets_per_second` of the calls the server has
//     not answered, with a burst of twice that; past it, the connection is
//     to be closed.
//   - gRPC enforces SETTINGS_MAX_CONCURRENT_STREAMS only once the client
//     has acknowledged the server's SETTINGS, so a client that never does
//     opens as many streams as it likes, about 17 KiB each. Here a
//     connection may have at most `max_open_streams` open; past it, the
//     connection is to be closed.
// A stream is open from the client's HEADERS that start it until the server
// ends it (END_STREAM or RST_STREAM) or the client resets it. A reset of a
// stream the server has already ended is free: gRPC clients send those.
//
// Thread safety: none; one connection's bytes, fed in the order they flow.
#ifndef PRECOMPILE_SERVER_GRPC_HTTP2_STREAM_LEDGER_H_
#define PRECOMPILE_SERVER_GRPC_HTTP2_STREAM_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace precompile::server {

struct Http2StreamLimits {
  // Streams a connection may have open at once. 0: no limit.
  int max_open_streams = 400;
  // Resets of unanswered calls a connection may send each second, with a
  // burst of twice as many. 0: no limit.
  int resets_per_second = 100;
};

class Http2StreamLedger {
 public:
  explicit Http2StreamLedger(Http2StreamLimits limits, absl::Time now);

  // The next bytes the client sent (starting with the connection preface),
  // at `now`. Not OK, naming why, once the connection has passed a limit or
  // is not HTTP/2: it is to be closed, and the ledger takes nothing more.
  absl::Status FromClient(absl::string_view bytes, absl::Time now);
  // The next bytes the server sent.
  void FromServer(absl::string_view bytes);

  // Which limit the connection passed, once FromClient has failed.
  enum class Breach { kNone, kNotHttp2, kStreams, kResets };
  Breach breach() const { return breach_; }
  int open_streams() const { return static_cast<int>(open_.size()); }
  // When the client last opened a stream (a call), or the ledger began.
  absl::Time last_opened() const { return last_opened_; }
  int64_t resets() const { return resets_; }

  // Whether the server's bytes so far end where a frame ends, after its
  // connection preface: where a frame of the front's own may go in.
  bool ServerBetweenFrames() const {
    return server_frames_ > 0 && server_.header_bytes == 0 && server_.payload_left == 0;
  }
  // From now on, watches for the client's acknowledgement of a PING whose
  // opaque data is `opaque` (its 8 bytes), which ping_acked() says.
  void ExpectPingAck(absl::string_view opaque);
  bool ping_acked() const { return ping_acked_; }

 private:
  // Splits a byte stream into frames: calls on_header(type, flags, stream)
  // once per frame, when its 9-byte header is complete. A frame whose
  // payload on_header asks to keep (`keep`, up to 8 bytes) is given to
  // on_kept(payload) once read.
  struct FrameReader {
    unsigned char header[9];
    size_t header_bytes = 0;
    uint32_t payload_left = 0;
    bool keep = false;
    std::string kept;
    template <typename OnHeader, typename OnKept>
    void Read(absl::string_view bytes, OnHeader on_header, OnKept on_kept);
  };

  absl::Status OnClientFrame(uint8_t type, uint32_t stream, absl::Time now);
  void OnServerFrame(uint8_t type, uint8_t flags, uint32_t stream);

  const Http2StreamLimits limits_;
  size_t preface_left_;
  FrameReader client_;
  FrameReader server_;
  absl::Status closed_;
  Breach breach_ = Breach::kNone;
  uint32_t last_client_stream_ = 0;
  absl::Time last_opened_;
  absl::flat_hash_set<uint32_t> open_;
  // The reset budget: tokens, refilled at resets_per_second up to twice that.
  double reset_tokens_;
  absl::Time refilled_at_;
  int64_t resets_ = 0;
  int64_t server_frames_ = 0;
  bool expecting_ping_ack_ = false;
  std::string ping_opaque_;
  bool ping_acked_ = false;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_HTTP2_STREAM_LEDGER_H_
