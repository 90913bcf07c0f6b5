#include "runtime/cuda_support.h"

#include <ATen/Context.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"

namespace precompile {
namespace {

// The directory of the libtorch this process runs, from one of its symbols.
std::string TorchLibraryDirectory() {
  Dl_info info{};
  // at::globalContext is defined in libtorch_cpu (at::hasCUDA is inline: it
  // would name this binary).
  if (dladdr(reinterpret_cast<void*>(&at::globalContext), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  std::string path = info.dli_fname;
  return path.substr(0, path.rfind('/'));
}

}  // namespace

absl::Status LoadCudaSupport() {
  static std::once_flag once;
  static std::string* error = new std::string;
  std::call_once(once, [] {
    const std::string dir = TorchLibraryDirectory();
    const std::string library = dir.empty() ? "libtorch_cuda.so" : dir + "/libtorch_cuda.so";
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      *error = absl::StrCat("cannot load ", library, ": ", dlerror());
    }
  });
  if (!error->empty()) return absl::FailedPreconditionError(*error);
  if (!at::hasCUDA()) {
    return absl::FailedPreconditionError(
        "libtorch_cuda is loaded but no CUDA device is usable");
  }
  return absl::OkStatus();
}

bool CudaAvailable() { return at::hasCUDA(); }

}  // namespace precompile
