#include "base/log_text.h"

#include <exception>
#include <new>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace precompile {

std::string LoggedText(absl::string_view text, size_t limit) {
  if (text.size() <= limit) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, limit)), "... (", text.size() - limit,
                      " more bytes)");
}

std::string ClientMessage(absl::string_view message) {
  if (message.size() <= kMaxClientMessageBytes) return std::string(message);
  size_t cut = kMaxClientMessageBytes;
  // Back to the first byte of a UTF-8 character (continuations are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), "... (", message.size() - cut, " more bytes)");
}

CaughtException DescribeCaughtException() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return {true, "out of memory"};
  } catch (const std::exception& e) {
    return {false, LoggedText(e.what(), 1024)};
  } catch (...) {
    return {false, "an exception that is not a std::exception"};
  }
}

}  // namespace precompile
