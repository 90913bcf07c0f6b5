#include "server/grpc/http2_stream_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace precompile::server {
namespace {

constexpr absl::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// RFC 9113 section 6.
constexpr uint8_t kData = 0x0;
constexpr uint8_t kHeaders = 0x1;
constexpr uint8_t kRstStream = 0x3;
constexpr uint8_t kPing = 0x6;
constexpr uint8_t kEndStream = 0x1;
constexpr uint8_t kAck = 0x1;

}  // namespace

Http2StreamLedger::Http2StreamLedger(Http2StreamLimits limits, absl::Time now)
    : limits_(limits),
      preface_left_(kPreface.size()),
      last_opened_(now),
      reset_tokens_(2.0 * limits.resets_per_second),
      refilled_at_(now) {}

template <typename OnHeader, typename OnKept>
void Http2StreamLedger::FrameReader::Read(absl::string_view bytes, OnHeader on_header,
                                          OnKept on_kept) {
  while (!bytes.empty()) {
    if (payload_left > 0) {
      const size_t skipped = std::min<size_t>(payload_left, bytes.size());
      if (keep) kept.append(bytes.data(), skipped);
      payload_left -= static_cast<uint32_t>(skipped);
      bytes.remove_prefix(skipped);
      if (keep && payload_left == 0) {
        keep = false;
        on_kept(absl::string_view(kept));
      }
      continue;
    }
    const size_t taken = std::min(sizeof header - header_bytes, bytes.size());
    std::copy_n(bytes.data(), taken, header + header_bytes);
    header_bytes += taken;
    bytes.remove_prefix(taken);
    if (header_bytes < sizeof header) return;
    header_bytes = 0;
    payload_left = uint32_t{header[0]} << 16 | uint32_t{header[1]} << 8 | header[2];
    const uint32_t stream = (uint32_t{header[5]} << 24 | uint32_t{header[6]} << 16 |
                             uint32_t{header[7]} << 8 | header[8]) &
                            0x7fffffff;
    kept.clear();
    if (!on_header(header[3], header[4], stream)) return;
    if (keep && payload_left == 0) {
      keep = false;
      on_kept(absl::string_view(kept));
    }
  }
}

absl::Status Http2StreamLedger::FromClient(absl::string_view bytes, absl::Time now) {
  if (!closed_.ok()) return closed_;
  if (preface_left_ > 0) {
    const size_t taken = std::min(preface_left_, bytes.size());
    const absl::string_view expected = kPreface.substr(kPreface.size() - preface_left_, taken);
    if (bytes.substr(0, taken) != expected) {
      breach_ = Breach::kNotHttp2;
      closed_ = absl::InvalidArgumentError("the client did not open with HTTP/2's preface");
      return closed_;
    }
    preface_left_ -= taken;
    bytes.remove_prefix(taken);
  }
  client_.Read(
      bytes,
      [&](uint8_t type, uint8_t flags, uint32_t stream) {
        closed_ = OnClientFrame(type, stream, now);
        client_.keep = expecting_ping_ack_ && type == kPing && (flags & kAck) &&
                       client_.payload_left == ping_opaque_.size();
        return closed_.ok();
      },
      [&](absl::string_view payload) {
        if (payload == ping_opaque_) {
          expecting_ping_ack_ = false;
          ping_acked_ = true;
        }
      });
  return closed_;
}

void Http2StreamLedger::FromServer(absl::string_view bytes) {
  server_.Read(
      bytes,
      [&](uint8_t type, uint8_t flags, uint32_t stream) {
        ++server_frames_;
        OnServerFrame(type, flags, stream);
        return true;
      },
      [](absl::string_view) {});
}

void Http2StreamLedger::ExpectPingAck(absl::string_view opaque) {
  ping_opaque_ = std::string(opaque);
  expecting_ping_ack_ = true;
  ping_acked_ = false;
}

absl::Status Http2StreamLedger::OnClientFrame(uint8_t type, uint32_t stream, absl::Time now) {
  if (type == kHeaders && stream % 2 == 1 && stream > last_client_stream_) {
    // A new stream; HEADERS on an older one are its trailers.
    last_client_stream_ = stream;
    last_opened_ = now;
    open_.insert(stream);
    if (limits_.max_open_streams > 0 && open_streams() > limits_.max_open_streams) {
      breach_ = Breach::kStreams;
      return absl::ResourceExhaustedError(
          absl::StrCat("the client opened more than ", limits_.max_open_streams,
                       " streams at once (it must not pass the server's "
                       "SETTINGS_MAX_CONCURRENT_STREAMS)"));
    }
  } else if (type == kRstStream && open_.erase(stream) > 0) {
    ++resets_;
    if (limits_.resets_per_second > 0) {
      const double rate = limits_.resets_per_second;
      // The wall clock may step back: that refills nothing and takes nothing.
      const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - refilled_at_));
      reset_tokens_ = std::min(2.0 * rate, reset_tokens_ + rate * elapsed);
      refilled_at_ = now;
      if (reset_tokens_ < 1.0) {
        breach_ = Breach::kResets;
        return absl::ResourceExhaustedError(
            absl::StrCat("the client reset more than ", limits_.resets_per_second,
                         " calls a second before their answers (HTTP/2's rapid reset)"));
      }
      reset_tokens_ -= 1.0;
    }
  }
  return absl::OkStatus();
}

void Http2StreamLedger::OnServerFrame(uint8_t type, uint8_t flags, uint32_t stream) {
  if (type == kRstStream || ((type == kHeaders || type == kData) && (flags & kEndStream))) {
    open_.erase(stream);
  }
}

}  // namespace precompile::server
