// Tensors and scalar arguments written as JSON, the way the command-line
// tools take them (inline --input values, load-mix templates) and print
// them (--json).
//
// A tensor spec is an object:
//   {"shape": [2, 4], "datatype": "FP32", "data": [1, 2, ...]}  values, flat or nested
//   {"shape": [8, 4], "datatype": "FP32", "fill": "random"}     "zeros", "ones", "random"
//                                                               or a number
//   {"npy": "x.npy"}                                            a .npy file
// "datatype" defaults to FP32. Random fills are uniform in [-1, 1) for
// floating types and in [0, 10) for integers.
//
// Thread safety: free functions; the generator passed in is the caller's.
#ifndef PRECOMPILE_CLIENT_TENSOR_JSON_H_
#define PRECOMPILE_CLIENT_TENSOR_JSON_H_

#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/infer_request.h"
#include "base/json_text.h"
#include "client/tensor.h"

namespace precompile::client {

// The tensor `name` described by `spec`. A relative "npy" path is resolved
// against `base_directory` when it is not empty. INVALID_ARGUMENT says which
// field is wrong (values that do not fit the datatype, a count that does not
// match the shape, ...); errors from reading a .npy file are ReadNpy's.
absl::StatusOr<Tensor> TensorFromJson(absl::string_view name, const Json& spec,
                                      std::mt19937_64& rng, const std::string& base_directory = "");

// A scalar argument from JSON: true/false -> bool, an integer (3) -> int,
// any other number (3.0, 1e3) -> float, a string -> str. INVALID_ARGUMENT
// otherwise.
absl::StatusOr<ScalarValue> ScalarFromJson(const Json& value);

// A scalar argument from command-line text: "true"/"false" -> bool, "3" ->
// int, "0.5" / "1e-3" / "nan" / "inf" -> float, "\"3\"" (double quotes) -> the str "3",
// anything else -> str.
ScalarValue ScalarFromText(absl::string_view text);

// The tensor's values as a flat JSON array in row-major order: integers
// exactly, floats with enough digits to read back the same value.
// REQUIRES: ValidateTensor(tensor).ok().
Json TensorValuesJson(const Tensor& tensor);

// A scalar as JSON (bool, number or string).
Json ScalarJson(const ScalarValue& value);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_TENSOR_JSON_H_
