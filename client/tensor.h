// Tensors as the client holds them: a KServe v2 datatype name ("FP32",
// "INT64", ...), a shape and the raw little-endian, row-major bytes, the same
// layout as raw_input_contents / raw_output_contents on the wire and as the
// data of a C-order .npy file. Nothing here knows gRPC or torch.
#ifndef PRECOMPILE_CLIENT_TENSOR_H_
#define PRECOMPILE_CLIENT_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace precompile::client {

struct Tensor {
  std::string name;
  // A KServe v2 datatype: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16,
  // INT32, INT64, FP16, BF16, FP32, FP64. (BYTES is not supported: models
  // served here take numeric tensors only.)
  std::string datatype;
  std::vector<int64_t> shape;
  // ElementCount(shape) * ElementSize(datatype) bytes, little-endian.
  std::string data;
};

// Bytes per element of `datatype`. INVALID_ARGUMENT names the datatype when
// it is unknown or BYTES.
absl::StatusOr<int> ElementSize(absl::string_view datatype);

// True for FP16, BF16, FP32 and FP64.
bool IsFloatingDatatype(absl::string_view datatype);

// Product of the dimensions. INVALID_ARGUMENT for a negative dimension or a
// product that overflows int64.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape);

// OK when the datatype is known and `data` holds exactly the bytes its shape
// needs; otherwise INVALID_ARGUMENT naming the tensor and the mismatch.
absl::Status ValidateTensor(const Tensor& tensor);

// Element `index` of a validated tensor, widened: floating types (FP16 and
// BF16 included) as double, signed and unsigned integers and BOOL exactly.
// REQUIRES: ValidateTensor(tensor).ok() and 0 <= index < element count.
double ElementAsDouble(const Tensor& tensor, int64_t index);
int64_t ElementAsInt64(const Tensor& tensor, int64_t index);
uint64_t ElementAsUint64(const Tensor& tensor, int64_t index);

// Element `index` for people: integers exactly, "true"/"false", floats with
// `float_digits` significant digits (nan, inf, -inf as such).
std::string FormatElement(const Tensor& tensor, int64_t index, int float_digits = 6);

// "[8, 4]"
std::string FormatShape(const std::vector<int64_t>& shape);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_TENSOR_H_
