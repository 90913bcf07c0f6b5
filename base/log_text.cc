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
