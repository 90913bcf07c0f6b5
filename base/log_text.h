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
