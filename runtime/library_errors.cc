#include "runtime/library_errors.h"

#include <utility>

namespace precompile {
namespace {

constexpr absl::string_view kShimException = "Exception in aoti_torch: ";
constexpr size_t kMaxBytes = 512;

struct Noted {
  bool any = false;
  std::string first;
};
thread_local Noted noted;

}  // namespace

void NoteLibraryLine(absl::string_view line) {
  if (noted.any) return;
  const size_t at = line.find(kShimException);
  if (at == absl::string_view::npos) return;
  absl::string_view what = line.substr(at + kShimException.size());
  what = what.substr(0, std::min(what.find('\n'), kMaxBytes));
  noted.any = true;
  noted.first = std::string(what);
}

void ForgetLibraryErrors() { noted = Noted{}; }

std::string TakeLibraryError() {
  std::string first = std::move(noted.first);
  noted = Noted{};
  return first;
}

}  // namespace precompile
