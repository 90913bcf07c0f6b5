#include "runtime/variant.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/cuda_support.h"
#include "runtime/inference_memory.h"
#include "runtime/library_errors.h"
#include "runtime/torch_errors.h"

namespace precompile {
namespace {

// AOTIModelPackageLoader's constructor unpacks into a temporary directory
// and registers global state without locking: load packages one at a time.
std::mutex loader_mutex;

// How AOTInductor's runner reports any exception of the compiled code
// ("run_func_(...) API call failed at <its own source file>, line N"),
// having written the exception's message to stderr: the client gets what
// happened without the runner's source line.
constexpr absl::string_view kRunnerFailed = "API call failed at";

}  // namespace

Variant::Variant(std::string id, DeviceType device, int device_index,
                 std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader)
    : id_(std::move(id)),
      run_what_(absl::StrCat("running variant ", id_)),
      device_(device),
      device_index_(device_index),
      loader_(std::move(loader)) {}

Variant::~Variant() = default;

absl::StatusOr<std::unique_ptr<Variant>> Variant::Load(
    const std::string& id, const std::string& package_path,
    const VariantOptions& options) {
  std::lock_guard<std::mutex> lock(loader_mutex);
  auto loader = CallTorch(absl::StrCat("loading variant ", id), [&] {
    return std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        package_path, "model", /*run_single_threaded=*/false,
        static_cast<size_t>(options.num_runners),
        static_cast<c10::DeviceIndex>(options.device_index));
  });
  if (!loader.ok()) {
    // An artifact from before manifests named the operators compiled code
    // calls gets here for one that this process lacks.
    if (absl::StrContains(loader.status().message(), "Could not find schema for")) {
      return absl::Status(
          loader.status().code(),
          absl::StrCat(loader.status().message(),
                       " (an operator of a library this server did not load: load it with "
                       "--op_library; or, where it is defined in Python, capture the model again "
                       "with this capture tool, whose manifest names the module that defines it, "
                       "and serve it with --allow_python_programs)"));
    }
    return loader.status();
  }
  return std::unique_ptr<Variant>(
      new Variant(id, options.device, options.device_index, *std::move(loader)));
}

absl::StatusOr<std::vector<at::Tensor>> Variant::Run(
    std::vector<at::Tensor> inputs) const {
  // The package's first run finishes setting up its constants, and for that
  // it waits for every other run to leave while holding one of its runners;
  // runs that wait for a free runner meanwhile never leave, and the variant
  // deadlocks for good once its first calls outnumber its runners
  // (AOTInductorModelContainer::run in torch 2.11). So the first runs go one
  // at a time; after one has finished, runs take no lock here.
  if (!ran_once_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(first_run_mu_);
    if (!ran_once_.load(std::memory_order_relaxed)) {
      // The constants it sets up are the model's for as long as it is
      // loaded, not memory of the call that happened to come first.
      UnchargedSection model_memory;
      absl::StatusOr<std::vector<at::Tensor>> out = RunLoader(std::move(inputs));
      // On CUDA the set-up is queued on this call's stream: runs on other
      // streams may read the constants only once it is done.
      if (out.ok() && device_ == DeviceType::kCuda) {
        if (absl::Status done = SynchronizeCurrentStream(device_index_); !done.ok()) return done;
      }
      // A run that failed may have failed before the set-up finished.
      if (out.ok()) ran_once_.store(true, std::memory_order_release);
      return out;
    }
  }
  return RunLoader(std::move(inputs));
}

absl::StatusOr<std::vector<at::Tensor>> Variant::RunLoader(
    std::vector<at::Tensor> inputs) const {
  ForgetLibraryErrors();
  absl::StatusOr<std::vector<at::Tensor>> out = CallTorch(run_what_, [&] {
    for (at::Tensor& t : inputs) {
      if (device_ == DeviceType::kCuda && !t.is_cuda()) {
        t = t.to(at::kCUDA, /*non_blocking=*/false);
      }
      // The compiled code assumes the strides it was traced with (dense).
      if (!t.is_contiguous()) t = t.contiguous();
    }
    return loader_->boxed_run(std::move(inputs));
  });
  if (!out.ok() && absl::StrContains(out.status().message(), kRunnerFailed)) {
    const std::string why = TakeLibraryError();
    return absl::Status(
        out.status().code(),
        absl::StrCat(run_what_, ": the compiled code raised an error",
                     why.empty() ? ", which AOTInductor writes only to the server's log"
                                 : absl::StrCat(": ", why)));
  }
  return out;
}

}  // namespace precompile
