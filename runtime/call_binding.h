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

// How tensors cross between host memory and a CUDA device.
enum class CudaCopies {
  // Straight from and to the host memory they are in (pageable): CUDA
  // stages a copy to the device itself, the thread waiting, and each copy
  // to the host waits for the stream.
  kPageable,
  // Through pinned buffers (libtorch's caching host allocator, which keeps
  // what the most calls at once have used): a copy to the device is a
  // memcpy on the host into one, then queued; copies to the host are queued
  // into them, the stream waited for once for all, then each copied out on
  // the host into memory the caller keeps.
  kPinned,
};

struct BoundArguments {
  // One per parameter of the frame, defaults filled in, on the model's device.
  std::vector<c10::IValue> positional;
  // The caller's tensors as they arrived (host memory, not copied): an
  // output that aliases one must be copied before the caller keeps it.
  std::vector<at::Tensor> request_tensors;
};

// Binds `args` to `frame`'s parameters by name; tensors are wrapped, not
// copied, and then moved to `device` (on CUDA, as `copies` says, queued on
// the current stream). `model` names the model in messages.
// Errors: INVALID_ARGUMENT naming the argument (unknown, given twice,
// missing without a default, of the wrong kind, bytes that do not match its
// shape, an index out of its range); INTERNAL when torch fails.
absl::StatusOr<BoundArguments> BindArguments(const artifact::v1::Frame& frame,
                                             absl::string_view model,
                                             absl::Span<const NamedValue> args, DeviceType device,
                                             CudaCopies copies = CudaCopies::kPageable);

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
// larger tensor (an output's owner keeps alive only its nbytes). Those on a
// CUDA device come as `copies` says, on the current stream, which is waited
// for before this returns: what stays on the device is computed by then, for
// calls on other streams to read. INTERNAL for a dtype the protocol cannot
// carry, or when torch fails (a CUDA error shows here first).
absl::StatusOr<std::vector<OutputTensor>> HostOutputs(std::vector<at::Tensor> outputs,
                                                      absl::Span<const at::Tensor> request_tensors,
                                                      const std::vector<bool>* on_device = nullptr,
                                                      CudaCopies copies = CudaCopies::kPageable);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_CALL_BINDING_H_
