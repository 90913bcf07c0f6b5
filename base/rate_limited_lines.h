// A stream buffer for std::cerr that passes whole lines at a bounded rate.
//
// What the server does not write itself reaches std::cerr: libtorch's
// warnings and logs, and AOTInductor's two lines for every model call that
// fails inside it. A client that makes calls fail (inputs past the memory
// limit, say) would make those lines as fast as the server answers, and
// each may quote what the client sent. Behind this buffer each thread's
// text goes out a line at a time, cut to a bounded length, at most so many
// lines a window; the rest are counted and the count said once lines pass
// again.
//
// Thread safety: any number of threads may write at once (std::cerr is
// shared); each thread's partial line is kept apart until its newline.
#ifndef PRECOMPILE_BASE_RATE_LIMITED_LINES_H_
#define PRECOMPILE_BASE_RATE_LIMITED_LINES_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <streambuf>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace precompile {

class RateLimitedLines : public std::streambuf {
 public:
  struct Options {
    int lines_per_window = 100;
    absl::Duration window = absl::Minutes(1);
    // Longer lines are cut, saying how much went.
    size_t max_line_bytes = 2048;
    // Sees every whole line, passed or dropped, on the thread that wrote it
    // (which may not write to the stream meanwhile).
    std::function<void(absl::string_view line)> observe;
  };
  // Gets each line passed, its newline included.
  using Writer = std::function<void(absl::string_view line)>;
  using Clock = std::function<absl::Time()>;

  RateLimitedLines(Options options, Writer write, Clock now = absl::Now);

  // Lines dropped since the last that passed (for tests).
  int64_t dropped() const;

 protected:
  int_type overflow(int_type c) override;
  std::streamsize xsputn(const char* text, std::streamsize size) override;

 private:
  struct PartialLine {
    std::string text;
    size_t cut_bytes = 0;  // Past max_line_bytes, not kept.
  };
  void Append(PartialLine& line, absl::string_view text);
  // Passes or drops a whole line. REQUIRES: mu_ held.
  void EndLine(PartialLine& line);

  const Options options_;
  const Writer write_;
  const Clock now_;
  mutable std::mutex mu_;
  std::unordered_map<std::thread::id, PartialLine> partial_;  // Guarded by mu_.
  absl::Time window_start_ = absl::InfinitePast();             // Guarded by mu_.
  int lines_in_window_ = 0;                                     // Guarded by mu_.
  int64_t dropped_ = 0;                                         // Guarded by mu_.
};

}  // namespace precompile

#endif  // PRECOMPILE_BASE_RATE_LIMITED_LINES_H_
