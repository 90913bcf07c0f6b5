// The one place where exceptions thrown by libtorch become absl::Status.
// Every call into libtorch that can throw goes through CallTorch().
#ifndef PRECOMPILE_RUNTIME_TORCH_ERRORS_H_
#define PRECOMPILE_RUNTIME_TORCH_ERRORS_H_

#include <c10/util/Exception.h>

#include <exception>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace precompile {

// torch's message without the C++ stack trace it appends in debug builds.
inline std::string TorchMessage(const c10::Error& e) {
  return e.what_without_backtrace();
}

// Runs `fn` and turns anything it throws into a status whose message starts
// with `what` (e.g. "running variant forward#0"). `fn` returns T or void.
template <typename Fn>
auto CallTorch(absl::string_view what, Fn&& fn)
    -> std::conditional_t<std::is_void_v<std::invoke_result_t<Fn>>,
                          absl::Status,
                          absl::StatusOr<std::invoke_result_t<Fn>>> {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
      std::forward<Fn>(fn)();
      return absl::OkStatus();
    } else {
      return std::forward<Fn>(fn)();
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(what, ": ", TorchMessage(e)));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of memory"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_TORCH_ERRORS_H_
