// What a call's arguments become before any frame runs, and what its
// outputs become for the caller to keep: the part of LoadedVersion::Call
// that knows neither guards, variants nor eager programs.
//
// Arguments arrive by name as Values (runtime/value.h) pointing at the
// caller's bytes; frames take positional IValues on the model's device.
// Every check a caller's arguments can fail is here, before any model code
// runs: unknown, repeated and missing names, the kind of each value, a
// tensor's byte count against its shape and dtype, and the values of
// arguments the capture found used as indices (compiled code that indexes
// past a table's end ends the process: its bounds check throws inside an
// OpenMP region).
#ifndef PRECOMPILE_RUNTIME_CALL_BINDING_H_
#define PRECOMPILE_RUNTIME_CALL_BINDING_H_

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/artifact.pb.h"
#include "runtime/value.h"

namespace precompile {

struct BoundArguments {
  // One per parameter of the frame, defaults filled in, on the model's device.
  std::vector<c10::IValue> positional;
  // The caller's tensors as they arrived (host memory, not copied): an
  // output that aliases one must be copied before the caller keeps it.
  std::vector<at::Tensor> request_tensors;
};

// Binds `args` to `frame`'s parameters by name; tensors are wrapped, not
// copied, and then moved to `device`. `model` names the model in messages.
// Errors: INVALID_ARGUMENT naming the argument (unknown, given twice,
// missing without a default, of the wrong kind, bytes that do not match its
// shape, an index out of its range); INTERNAL when torch fails.
absl::StatusOr<BoundArguments> BindArguments(const artifact::v1::Frame& frame,
                                             absl::string_view model,
                                             absl::Span<const NamedValue> args,
                                             DeviceType device);

// A parameter's recorded default.
c10::IValue ScalarToIValue(const artifact::v1::Scalar& s);

// The index-range check for a frame an eager program calls, whose arguments
// are tensors already (on the model's device): INVALID_ARGUMENT naming the
// frame, the argument and a value outside its range.
absl::Status CheckIndexRanges(const artifact::v1::Frame& frame,
                              const std::vector<c10::IValue>& args);

// `outputs` as the caller keeps them: in host memory (but those on a CUDA
// device whose index `on_device` marks, which stay there), contiguous,
// copied where they alias one of `request_tensors` or are a part of a
// larger tensor (an output's owner keeps alive only its nbytes). INTERNAL
// for a dtype the protocol cannot carry, or when torch fails (a CUDA error
// shows here first). Outputs left on the device may still be being
// computed: the caller waits for its stream.
absl::StatusOr<std::vector<OutputTensor>> HostOutputs(
    std::vector<at::Tensor> outputs, absl::Span<const at::Tensor> request_tensors,
    const std::vector<bool>* on_device = nullptr);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_CALL_BINDING_H_
