// The operators outside ATen that a version's compiled code calls by name.
//
// AOTInductor looks each up when a variant loads, and fails ("Could not find
// schema") where this process has none. A library loaded with --op_library
// registers operators written in C++; one defined in Python
// (torch.library.custom_op, as transformers defines its mixture-of-experts
// matmul on the CPU) is registered by importing its module in the Python
// plugin's interpreter, which then runs its calls under the GIL.
#ifndef PRECOMPILE_RUNTIME_OPERATORS_H_
#define PRECOMPILE_RUNTIME_OPERATORS_H_

#include "absl/status/status.h"
#include "proto/artifact.pb.h"
#include "runtime/python_program.h"

namespace precompile {

// Registers what `manifest.operators()` names and this process lacks, by
// importing the modules that define them in Python where `python` allows.
// FAILED_PRECONDITION naming the operator when one stays missing: no
// module defines it, Python is not allowed, or its import failed.
absl::Status ProvideOperators(const artifact::v1::Manifest& manifest,
                              const PythonSettings& python);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_OPERATORS_H_
