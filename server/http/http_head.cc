#include "server/http/http_head.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace precompile::server {
namespace {

// RFC 9110's tchar: what a method and a field name are made of.
bool IsTokenChar(char c) {
  if (absl::ascii_isalnum(static_cast<unsigned char>(c))) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+':
    case '-': case '.': case '^': case '_': case '`': case '|': case '~': return true;
    default: return false;
  }
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Field values may hold visible characters, blanks and obs-text (bytes past
// 0x7f), nothing else: a NUL or a bare CR is how requests get smuggled past
// proxies that read them differently.
bool IsFieldValue(absl::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
  }
  return true;
}

// A blank-free text, for quoting what a client sent in a message.
std::string Quoted(absl::string_view s) {
  constexpr size_t kMax = 64;
  std::string out;
  for (char c : s.substr(0, kMax)) {
    const auto u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (s.size() > kMax) out += "...";
  return absl::StrCat("'", out, "'");
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

absl::StatusOr<std::string> DecodePath(absl::string_view target) {
  const absl::string_view path = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') {
      out += path[i];
      continue;
    }
    const int high = i + 2 < path.size() ? HexValue(path[i + 1]) : -1;
    const int low = i + 2 < path.size() ? HexValue(path[i + 2]) : -1;
    if (high < 0 || low < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the path ", Quoted(target), " has a '%' not followed by two hex digits"));
    }
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

// Digits only (no sign, no blanks inside); past UINT64_MAX saturates.
std::optional<uint64_t> ParseLength(absl::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t value = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      value = std::numeric_limits<uint64_t>::max();
    } else {
      value = value * 10 + digit;
    }
  }
  return value;
}

// Whether a comma-separated field value lists `token` (case-insensitive).
bool ListsToken(absl::string_view value, absl::string_view token) {
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(item), token)) return true;
  }
  return false;
}

absl::Status ParseRequestLine(absl::string_view line, HttpHead& head) {
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request line ", Quoted(line), " is not 'METHOD /path HTTP/1.1'"));
  }
  const absl::string_view version = parts[2];
  if (version == "HTTP/1.1") {
    head.minor_version = 1;
  } else if (version == "HTTP/1.0") {
    head.minor_version = 0;
  } else if (absl::StartsWith(version, "HTTP/")) {
    return absl::UnimplementedError(
        absl::StrCat("this server speaks HTTP/1.1 and HTTP/1.0, not ", Quoted(version)));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request line ", Quoted(line), " is not 'METHOD /path HTTP/1.1'"));
  }
  const absl::string_view target = parts[1];
  if (target[0] != '/' || !IsFieldValue(target)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request target ", Quoted(target), " is not a path starting with '/'"));
  }
  head.method = std::string(parts[0]);
  absl::StatusOr<std::string> path = DecodePath(target);
  if (!path.ok()) return path.status();
  head.path = *std::move(path);
  return absl::OkStatus();
}

}  // namespace

const std::string* HttpHead::Find(absl::string_view lower_name) const {
  for (const auto& [name, value] : fields) {
    if (name == lower_name) return &value;
  }
  return nullptr;
}

size_t SkipEmptyLines(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    if (bytes[i] == '\n') {
      ++i;
    } else if (bytes[i] == '\r' && i + 1 < bytes.size() && bytes[i + 1] == '\n') {
      i += 2;
    } else {
      break;
    }
  }
  return i;
}

std::optional<size_t> FindHeadEnd(absl::string_view bytes) {
  // Each line ends in LF; the head ends at the first line that is empty
  // (nothing, or a lone CR, before its LF).
  size_t line_start = 0;
  for (size_t lf = bytes.find('\n'); lf != absl::string_view::npos;
       lf = bytes.find('\n', line_start)) {
    const size_t length = lf - line_start;
    if (line_start > 0 && (length == 0 || (length == 1 && bytes[line_start] == '\r'))) {
      return lf + 1;
    }
    line_start = lf + 1;
  }
  return std::nullopt;
}

absl::StatusOr<HttpHead> ParseHttpHead(absl::string_view head, size_t max_fields) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  // The empty line that ends the head, and what split makes of the LF after it.
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError("the request has no request line");

  HttpHead parsed;
  if (absl::Status s = ParseRequestLine(lines[0], parsed); !s.ok()) return s;
  bool connection_close = false;
  bool connection_keep_alive = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (parsed.fields.size() == max_fields) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the request has more than ", max_fields, " header fields"));
    }
    if (line.empty() || line[0] == ' ' || line[0] == '\t') {
      return absl::InvalidArgumentError(
          "the request has a header line folded onto the one before (obsolete; send one line)");
    }
    const size_t colon = line.find(':');
    const absl::string_view name = line.substr(0, colon);
    if (colon == absl::string_view::npos || !IsToken(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the header line ", Quoted(line), " is not 'Name: value' with a token for a name"));
    }
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (!IsFieldValue(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the header ", Quoted(name), " has control characters in its value"));
    }
    std::string lower = absl::AsciiStrToLower(name);
    if (lower == "content-length") {
      const std::optional<uint64_t> length = ParseLength(value);
      if (!length) {
        return absl::InvalidArgumentError(
            absl::StrCat("Content-Length ", Quoted(value), " is not a number of bytes"));
      }
      if (parsed.content_length && *parsed.content_length != *length) {
        return absl::InvalidArgumentError("the request has two different Content-Lengths");
      }
      parsed.content_length = length;
    } else if (lower == "transfer-encoding") {
      parsed.transfer_encoding = true;
    } else if (lower == "connection") {
      connection_close |= ListsToken(value, "close");
      connection_keep_alive |= ListsToken(value, "keep-alive");
    } else if (lower == "expect") {
      parsed.expect_continue |= absl::EqualsIgnoreCase(value, "100-continue");
    }
    parsed.fields.emplace_back(std::move(lower), std::string(value));
  }
  parsed.keep_alive =
      !connection_close && (parsed.minor_version == 1 || connection_keep_alive);
  return parsed;
}

}  // namespace precompile::server
