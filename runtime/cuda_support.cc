#include "runtime/cuda_support.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/torch_errors.h"

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

namespace {

// CUDA through c10's device-generic interface, which libtorch_cuda
// registers when it loads: this library does not link it.
const c10::impl::DeviceGuardImplInterface& Cuda() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

c10::Device CudaDevice(int device_index) {
  return c10::Device(c10::DeviceType::CUDA,
                     device_index < 0 ? Cuda().getDevice().index()
                                      : static_cast<c10::DeviceIndex>(device_index));
}

}  // namespace

struct CudaCall::Previous {
  c10::Device device;
  c10::Stream stream;
};

CudaCall::CudaCall(std::unique_ptr<Previous> previous) : previous_(std::move(previous)) {}

absl::StatusOr<std::unique_ptr<CudaCall>> CudaCall::Enter(int device_index, bool own_stream) {
  if (!CudaAvailable()) {
    return absl::FailedPreconditionError("a CUDA call was entered without a usable CUDA device");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Previous> previous,
                   CallTorch("entering the CUDA device for the call", [&] {
                     const c10::Device device = CudaDevice(device_index);
                     const c10::Device previous_device = Cuda().exchangeDevice(device);
                     const c10::Stream stream = own_stream
                                                    ? Cuda().getStreamFromGlobalPool(device)
                                                    : Cuda().getStream(device);
                     const c10::Stream previous_stream = Cuda().exchangeStream(stream);
                     return std::make_unique<Previous>(Previous{previous_device, previous_stream});
                   }));
  return std::unique_ptr<CudaCall>(new CudaCall(std::move(previous)));
}

CudaCall::~CudaCall() {
  // Both only set what is current for the thread.
  Cuda().exchangeStream(previous_->stream);
  Cuda().setDevice(previous_->device);
}

absl::Status CheckPinnedMemory() {
  const absl::Status allocated = CallTorch("allocating pinned host memory", [] {
    at::empty({1}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  });
  if (allocated.ok()) return allocated;
  return absl::FailedPreconditionError(allocated.message());
}

absl::Status SynchronizeCurrentStream(int device_index) {
  return CallTorch("waiting for the CUDA stream", [&] {
    Cuda().synchronizeStream(Cuda().getStream(CudaDevice(device_index)));
  });
}

}  // namespace precompile
