// A frame run eagerly, without Python: what serves a flagged frame's misses.
//
// The interface hides the interpreter so that TorchScript (deprecated
// upstream) can be replaced by another backend without touching dispatch.
//
// Thread safety: Run() may be called concurrently.
#ifndef PRECOMPILE_RUNTIME_EAGER_PROGRAM_H_
#define PRECOMPILE_RUNTIME_EAGER_PROGRAM_H_

#include <ATen/core/ivalue.h>

#include <vector>

#include "absl/status/statusor.h"

namespace precompile {

class EagerProgram {
 public:
  virtual ~EagerProgram() = default;

  // Runs the frame on `args` (one per parameter, in signature order) and
  // returns what it returned flattened into leaves, in the order of
  // torch.utils._pytree (tuples, lists and dict values in order; None and
  // other scalars are leaves too). A failing call of another frame inside it
  // returns that frame's status unchanged.
  virtual absl::StatusOr<std::vector<c10::IValue>> Run(
      std::vector<c10::IValue> args) const = 0;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_EAGER_PROGRAM_H_
