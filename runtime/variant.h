// One compiled variant: a loaded AOTInductor package.
//
// The package's loader keeps a pool of `num_runners` model instances, so up
// to that many calls run at once and further calls wait for a free one.
//
// Thread safety: Run() may be called concurrently. Loading takes a process-
// wide lock because the AOTInductor loader's constructor is not thread-safe.
// A variant's first run goes alone (see Run).
#ifndef PRECOMPILE_RUNTIME_VARIANT_H_
#define PRECOMPILE_RUNTIME_VARIANT_H_

#include <ATen/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/dtype.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace precompile {

struct VariantOptions {
  DeviceType device = DeviceType::kCpu;
  // CUDA device ordinal; -1 for the current device.
  int device_index = -1;
  // Model instances that can run at once. REQUIRES: >= 1.
  int num_runners = 2;
};

class Variant {
 public:
  // Loads the package at `package_path` (an absolute path). INTERNAL with the
  // loader's message if it cannot be loaded (e.g. a corrupted package, or a
  // CUDA package without the CUDA runtime).
  static absl::StatusOr<std::unique_ptr<Variant>> Load(
      const std::string& id, const std::string& package_path,
      const VariantOptions& options);
  ~Variant();

  // Runs the compiled code. `inputs` are the call's tensors in the order the
  // package takes them; they are made contiguous and moved to the variant's
  // device first. The outputs live on the variant's device.
  absl::StatusOr<std::vector<at::Tensor>> Run(
      std::vector<at::Tensor> inputs) const;

  const std::string& id() const { return id_; }

 private:
  Variant(std::string id, DeviceType device, int device_index,
          std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader);
  absl::StatusOr<std::vector<at::Tensor>> RunLoader(std::vector<at::Tensor> inputs) const;

  std::string id_;
  std::string run_what_;  // "running variant <id>", for errors; built once.
  DeviceType device_;
  int device_index_;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  // Whether a run has finished; until one has, runs take `first_run_mu_`.
  mutable std::atomic<bool> ran_once_{false};
  mutable std::mutex first_run_mu_;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_VARIANT_H_
