// EagerProgram on libtorch's TorchScript interpreter.
#include "runtime/torchscript_program.h"

#include <torch/csrc/jit/serialization/import.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/frame_caller.h"
#include "runtime/torch_errors.h"

namespace precompile {
namespace {

// Appends the leaves of `value` in torch.utils._pytree's order.
void Flatten(const c10::IValue& value, std::vector<c10::IValue>& leaves) {
  if (value.isTuple()) {
    for (const c10::IValue& e : value.toTupleRef().elements()) Flatten(e, leaves);
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toListRef()) Flatten(e, leaves);
  } else if (value.isGenericDict()) {
    // TorchScript dicts keep insertion order, as Python's do.
    for (const auto& entry : value.toGenericDict()) Flatten(entry.value(), leaves);
  } else {
    leaves.push_back(value);
  }
}

class TorchScriptProgram final : public EagerProgram {
 public:
  TorchScriptProgram(std::string frame, torch::jit::Module module)
      : frame_(std::move(frame)),
        run_what_(absl::StrCat("running frame ", frame_, " eagerly")),
        module_(std::move(module)) {}

  absl::StatusOr<std::vector<c10::IValue>> Run(
      std::vector<c10::IValue> args) const override {
    // forward() is const in effect; torch::jit::Module's API is not.
    auto& module = const_cast<torch::jit::Module&>(module_);
    absl::StatusOr<std::vector<c10::IValue>> result =
        CallTorch(run_what_, [&] {
          std::vector<c10::IValue> leaves;
          Flatten(module.forward(std::move(args)), leaves);
          return leaves;
        });
    if (!result.ok()) {
      if (std::optional<absl::Status> callee = TakeCalleeStatus()) {
        return *std::move(callee);
      }
    }
    return result;
  }

 private:
  const std::string frame_;
  const std::string run_what_;  // For errors; built once.
  const torch::jit::Module module_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EagerProgram>> LoadTorchScriptProgram(
    const std::string& frame, const std::string& path, DeviceType device) {
  auto module = CallTorch(
      absl::StrCat("loading the eager program of frame ", frame),
      [&] {
        torch::jit::Module m = torch::jit::load(
            path, c10::Device(device == DeviceType::kCuda ? c10::kCUDA : c10::kCPU));
        m.eval();
        return m;
      });
  if (!module.ok()) return module.status();
  return std::unique_ptr<EagerProgram>(
      new TorchScriptProgram(frame, *std::move(module)));
}

}  // namespace precompile
