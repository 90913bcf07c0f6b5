// HTTP/2 frames written byte by byte (RFC 9113 section 4.1), for the tests
// of what reads them.
#ifndef PRECOMPILE_SERVER_GRPC_HTTP2_TEST_FRAMES_H_
#define PRECOMPILE_SERVER_GRPC_HTTP2_TEST_FRAMES_H_

#include <cstdint>
#include <string>

namespace precompile::server::testing {

constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoaway = 7;
constexpr uint8_t kEndStream = 1, kEndHeaders = 4;

inline std::string Frame(uint8_t type, uint8_t flags, uint32_t stream,
                         const std::string& payload = "") {
  const uint32_t n = static_cast<uint32_t>(payload.size());
  std::string frame = {static_cast<char>(n >> 16),
                       static_cast<char>(n >> 8),
                       static_cast<char>(n),
                       static_cast<char>(type),
                       static_cast<char>(flags),
                       static_cast<char>(stream >> 24),
                       static_cast<char>(stream >> 16),
                       static_cast<char>(stream >> 8),
                       static_cast<char>(stream)};
  return frame + payload;
}

// RST_STREAM with CANCEL, as a client resets a call.
inline std::string Reset(uint32_t stream) {
  return Frame(kRstStream, 0, stream, std::string("\0\0\0\x08", 4));
}

}  // namespace precompile::server::testing

#endif  // PRECOMPILE_SERVER_GRPC_HTTP2_TEST_FRAMES_H_
