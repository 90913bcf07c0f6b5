// Arguments and results of a model call, without torch types, so that the
// server and clients of the runtime compile without torch's headers.
#ifndef PRECOMPILE_RUNTIME_VALUE_H_
#define PRECOMPILE_RUNTIME_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/dtype.h"

namespace precompile {

// A dense, row-major tensor argument whose bytes the caller owns. The bytes
// must stay valid and unchanged until the call that received them returns.
// They are in host memory, or (kCuda) in the memory of the model's CUDA
// device: an output a call left there (OutputTensor::device).
struct TensorArg {
  DType dtype = DType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Python's None.
struct NoneArg {};

// One argument of a frame call: a tensor, None, or a Python scalar.
using Value = std::variant<NoneArg, TensorArg, bool, int64_t, double, std::string>;

struct NamedValue {
  std::string name;
  Value value;
};

// A dense, row-major result tensor. `data` stays valid while `owner` (or a
// copy of it) is alive. It is in host memory unless the call was asked to
// leave it on its CUDA device (LoadedVersion::CallContext::
// outputs_on_device): then `data` is device memory, for a later call's
// TensorArg, and never for the host to read.
struct OutputTensor {
  DType dtype = DType::kFloat32;
  DeviceType device = DeviceType::kCpu;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> owner;
};

// How a frame call was served.
enum class Outcome : uint8_t {
  kVariant,        // A compiled variant's guards held and it ran.
  kEagerFallback,  // A flagged frame ran its eager program.
  kRefused,        // No variant matched and the frame is not flagged.
  kError,          // The call failed (bad arguments, or execution failed).
};

absl::string_view OutcomeName(Outcome outcome);

// The refusal of an argument `name` that `model` does not take, naming those
// it takes (`arguments`, already listed). A served model takes the arguments
// its example calls passed: one its code declares but no call passed is not
// among them.
absl::Status UnknownArgumentError(absl::string_view model, absl::string_view name,
                                  absl::string_view arguments);

// The elements of a tensor of `shape` whose elements take `element_size`
// bytes. INVALID_ARGUMENT, naming `what` ("input 'x'"), for a negative
// dimension, or for a shape no tensor can have: more than 2^62 bytes, its
// sizes of 0 counted as 1, since libtorch computes an empty tensor's
// strides from its other sizes ([0, 2^62] overflows them).
absl::StatusOr<uint64_t> ElementCount(absl::Span<const int64_t> shape, uint64_t element_size,
                                      absl::string_view what);

struct CallResult {
  std::vector<OutputTensor> outputs;
  Outcome outcome = Outcome::kVariant;
  // The variant's id when outcome is kVariant; empty otherwise.
  std::string variant_id;
  // The entry's eager program did not run (LoadedVersion::CallContext::
  // defer_entry_eager); outcome is kEagerFallback.
  bool eager_deferred = false;
  // No variant matched the entry and nothing ran (LoadedVersion::
  // CallContext::variant_only); outcome is kRefused.
  bool no_variant = false;
};

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_VALUE_H_
