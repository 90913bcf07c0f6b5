// Text that log lines quote from outside the server's control (what a client
// sent, what an exception says), and the exception a barrier caught.
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_BASE_LOG_TEXT_H_
#define PRECOMPILE_BASE_LOG_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace precompile {

// `text` escaped (C-style: no client can forge a log line) and cut to
// `limit` bytes before escaping, saying how much was cut.
std::string LoggedText(absl::string_view text, size_t limit);

// The longest error message a client gets whole. A message may quote what
// the client sent (a name of any length a request can carry), and gRPC
// clients refuse a status message over 16 KiB (its trailer is
// percent-encoded: up to three bytes a byte): a ModelMetadata call naming a
// model of 200 MB was answered with a 200 MB message no client could read,
// which grew the server by 650 MiB while it was made.
inline constexpr size_t kMaxClientMessageBytes = 4096;

// `message` as a client gets it: whole, or its first kMaxClientMessageBytes
// bytes (not splitting a UTF-8 character) and how many more there were.
std::string ClientMessage(absl::string_view message);

// What a catch-all barrier caught, for its log line and its answer.
struct CaughtException {
  bool out_of_memory = false;  // A std::bad_alloc.
  // LoggedText of what() (1024 bytes), or what the exception was.
  std::string what;
};

// REQUIRES: called inside a catch block; describes the exception it handles.
CaughtException DescribeCaughtException();

}  // namespace precompile

#endif  // PRECOMPILE_BASE_LOG_TEXT_H_
