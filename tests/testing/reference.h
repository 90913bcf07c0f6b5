// Reference calls of the example models: inputs and the outputs the Python
// model returned for them (tests/make_reference.py, built once by Bazel).
#ifndef PRECOMPILE_TESTS_TESTING_REFERENCE_H_
#define PRECOMPILE_TESTS_TESTING_REFERENCE_H_

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "runtime/value.h"

namespace precompile::testing {

struct ReferenceCall {
  // Arguments for LoadedVersion::Call; tensor arguments point into `tensors`.
  std::vector<NamedValue> args;
  std::vector<at::Tensor> tensors;
  // What the model returned in Python.
  std::vector<at::Tensor> expected;
};

// The reference call `call` of example `model` (see make_reference.py).
ReferenceCall Reference(const std::string& model, const std::string& call);

// Wraps a runtime output (host memory) as a tensor, without copying.
at::Tensor AsTensor(const OutputTensor& output);

// A tensor as a request argument, borrowing its bytes.
TensorArg AsTensorArg(const at::Tensor& tensor);

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_REFERENCE_H_
