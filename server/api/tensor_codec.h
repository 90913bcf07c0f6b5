// KServe v2 tensors to and from the runtime's tensors.
//
// Inputs arrive either as raw little-endian bytes (raw_input_contents[i]
// pairs with inputs[i]) or in the typed contents fields; FP16 and BF16 only
// travel raw. Every size is validated before any byte is copied, so a request
// that claims an enormous shape costs nothing.
#ifndef PRECOMPILE_SERVER_API_TENSOR_CODEC_H_
#define PRECOMPILE_SERVER_API_TENSOR_CODEC_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"
#include "runtime/value.h"

namespace precompile::server {

// "FP32" -> kFloat32, ...; nullopt for a datatype torch cannot hold here.
std::optional<DType> DTypeFromDatatype(absl::string_view datatype);
// kFloat32 -> "FP32", ...
const char* DatatypeOf(DType dtype);
// The Triton model-config enum for a dtype (TYPE_FP32, ...).
inference::DataType ConfigDataTypeOf(DType dtype);

// Decodes request input `index`. The returned tensor borrows the request's
// raw bytes, or `storage` when the values came in typed contents; both must
// outlive its use. INVALID_ARGUMENT names the input and the problem.
absl::StatusOr<TensorArg> DecodeInput(const inference::ModelInferRequest& request,
                                      int index, std::string* storage);

// Appends `tensor`'s name, datatype and shape to the response's outputs; its
// bytes go on the wire with SerializeInferResponse (server/grpc/infer_response.h)
// or EncodeInferResponse (server/http/http_codec.h).
void DescribeOutput(const OutputTensor& tensor, const std::string& name,
                    inference::ModelInferResponse* response);

// Whether an output's bytes go on the wire from the tensor itself, which the
// answer then holds until sent: one of kReferencedOutputBytes or more, with
// an owner to hold. A smaller one is copied next to the message, where the
// reference would cost more than the copy.
inline constexpr size_t kReferencedOutputBytes = 8 * 1024;
inline bool SentFromTensor(const OutputTensor& tensor) {
  return tensor.nbytes >= kReferencedOutputBytes && tensor.owner != nullptr;
}

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_TENSOR_CODEC_H_
