#include "base/rate_limited_lines.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace precompile {

RateLimitedLines::RateLimitedLines(Options options, Writer write, Clock now)
    : options_(options), write_(std::move(write)), now_(std::move(now)) {}

int64_t RateLimitedLines::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

RateLimitedLines::int_type RateLimitedLines::overflow(int_type c) {
  if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
  const char ch = traits_type::to_char_type(c);
  xsputn(&ch, 1);
  return c;
}

std::streamsize RateLimitedLines::xsputn(const char* text, std::streamsize size) {
  absl::string_view rest(text, static_cast<size_t>(size));
  std::lock_guard<std::mutex> lock(mu_);
  PartialLine& line = partial_[std::this_thread::get_id()];
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    if (newline == absl::string_view::npos) {
      Append(line, rest);
      return size;
    }
    Append(line, rest.substr(0, newline));
    rest.remove_prefix(newline + 1);
    EndLine(line);
  }
  // A thread between lines keeps no entry: the map holds only the threads
  // whose line is unfinished.
  partial_.erase(std::this_thread::get_id());
  return size;
}

void RateLimitedLines::Append(PartialLine& line, absl::string_view text) {
  const size_t room = options_.max_line_bytes - std::min(line.text.size(), options_.max_line_bytes);
  const size_t kept = std::min(room, text.size());
  line.text.append(text.data(), kept);
  line.cut_bytes += text.size() - kept;
}

void RateLimitedLines::EndLine(PartialLine& line) {
  if (options_.observe) options_.observe(line.text);
  const absl::Time now = now_();
  if (now - window_start_ >= options_.window) {
    window_start_ = now;
    lines_in_window_ = 0;
  }
  if (lines_in_window_ < options_.lines_per_window) {
    ++lines_in_window_;
    if (dropped_ > 0) {
      write_(absl::StrCat(dropped_, " lines dropped (more than ", options_.lines_per_window, " in ",
                          absl::FormatDuration(options_.window), ")\n"));
      dropped_ = 0;
    }
    if (line.cut_bytes > 0) {
      absl::StrAppend(&line.text, "... (", line.cut_bytes, " more bytes)");
    }
    line.text.push_back('\n');
    write_(line.text);
  } else {
    ++dropped_;
  }
  line.text.clear();
  line.cut_bytes = 0;
}

}  // namespace precompile
