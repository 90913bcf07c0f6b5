// An HTTP/1.1 request's head (request line and header fields) parsed from
// the bytes a client sent, strictly: what the HTTP transport
// (server/http/http_transport.h) needs that does not touch a socket, so that the
// fuzzer and the unit tests reach every branch.
//
// Refused, with a message naming the problem: a request line that is not
// `METHOD /path HTTP/1.x` (INVALID_ARGUMENT; UNIMPLEMENTED for another HTTP
// version), a header name that is not a token or a value with control bytes,
// a folded header line, Content-Length values that are not digits or
// disagree (a smuggling vector), a path with a bad %-escape, and more than
// `max_fields` header fields (RESOURCE_EXHAUSTED).
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_SERVER_HTTP_HTTP_HEAD_H_
#define PRECOMPILE_SERVER_HTTP_HTTP_HEAD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile::server {

struct HttpHead {
  std::string method;
  // The request target's path, %-decoded, without its query.
  std::string path;
  // 0 or 1: HTTP/1.0 or HTTP/1.1.
  int minor_version = 1;
  // In the order sent; names in lower case, values without surrounding
  // blanks.
  std::vector<std::pair<std::string, std::string>> fields;
  // A Content-Length larger than any buffer reads as UINT64_MAX.
  std::optional<uint64_t> content_length;
  // A Transfer-Encoding field was sent (its body is framed by chunks).
  bool transfer_encoding = false;
  // Whether the client keeps the connection after the answer: HTTP/1.1
  // unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
  bool keep_alive = true;
  // `Expect: 100-continue`: the client waits for a go-ahead before the body.
  bool expect_continue = false;

  // The first field named `lower_name`, or null.
  const std::string* Find(absl::string_view lower_name) const;
};

// Where the head that starts `bytes` ends: the offset just past its empty
// line (CRLF CRLF, or bare LF LF as lenient parsers accept), or nullopt while
// it has not all arrived. `bytes` must not start with an empty line (see
// SkipEmptyLines).
std::optional<size_t> FindHeadEnd(absl::string_view bytes);

// How many bytes of empty lines `bytes` starts with: RFC 9112 asks servers
// to ignore them before a request line.
size_t SkipEmptyLines(absl::string_view bytes);

// Parses a head: the bytes FindHeadEnd delimits, empty line included.
absl::StatusOr<HttpHead> ParseHttpHead(absl::string_view head, size_t max_fields);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_HTTP_HEAD_H_
