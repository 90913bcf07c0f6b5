#include "tests/testing/reference.h"

#include <ATen/ops/from_blob.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/import.h>

#include <cstdlib>
#include <map>

#include "absl/strings/str_split.h"
#include "runtime/torch_dtype.h"

namespace precompile::testing {
namespace {

const std::map<std::string, at::Tensor>& Buffers() {
  static const auto* buffers = [] {
    auto* map = new std::map<std::string, at::Tensor>;
    const char* srcdir = std::getenv("TEST_SRCDIR");
    const char* workspace = std::getenv("TEST_WORKSPACE");
    const std::string path = std::string(srcdir ? srcdir : ".") + "/" +
                             (workspace ? workspace : "precompile_serve") +
                             "/tests/reference.pt";
    torch::jit::Module module = torch::jit::load(path);
    for (const auto& buffer : module.named_buffers()) (*map)[buffer.name] = buffer.value;
    return map;
  }();
  return *buffers;
}

}  // namespace

TensorArg AsTensorArg(const at::Tensor& tensor) {
  TensorArg arg;
  arg.dtype = FromScalarType(tensor.scalar_type()).value_or(DType::kFloat32);
  arg.shape.assign(tensor.sizes().begin(), tensor.sizes().end());
  arg.data = tensor.data_ptr();
  arg.nbytes = tensor.nbytes();
  return arg;
}

at::Tensor AsTensor(const OutputTensor& output) {
  return at::from_blob(const_cast<void*>(output.data), output.shape,
                       at::TensorOptions().dtype(ToScalarType(output.dtype)));
}

ReferenceCall Reference(const std::string& model, const std::string& call) {
  ReferenceCall ref;
  const std::string prefix = model + "__" + call + "__";
  std::map<int, at::Tensor> outputs;
  for (const auto& [name, tensor] : Buffers()) {
    if (name.rfind(prefix, 0) != 0) continue;
    std::vector<std::string> parts = absl::StrSplit(name.substr(prefix.size()), "__");
    if (parts.size() != 2) {
      ADD_FAILURE() << "malformed reference entry " << name;
      continue;
    }
    if (parts[0] == "in") {
      ref.tensors.push_back(tensor);
      ref.args.push_back({parts[1], AsTensorArg(tensor)});
    } else if (parts[0] == "out") {
      outputs[std::stoi(parts[1])] = tensor;
    } else if (tensor.scalar_type() == c10::kBool) {
      ref.args.push_back({parts[1], tensor.item<bool>()});
    } else if (tensor.is_floating_point()) {
      ref.args.push_back({parts[1], tensor.item<double>()});
    } else {
      ref.args.push_back({parts[1], tensor.item<int64_t>()});
    }
  }
  for (auto& [index, tensor] : outputs) ref.expected.push_back(tensor);
  EXPECT_FALSE(ref.expected.empty()) << "no reference call " << model << "/" << call;
  return ref;
}

}  // namespace precompile::testing
