// Building KServe v2 ModelInferRequests from named tensors and scalar
// arguments, and reading ModelInferResponses back into tensors together with
// what precompile-serve says about how it served the call.
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_CLIENT_INFER_REQUEST_H_
#define PRECOMPILE_CLIENT_INFER_REQUEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/tensor.h"
#include "proto/inference.pb.h"

namespace precompile::client {

// A model's non-tensor argument: bool, int, float or str in Python.
using ScalarValue = std::variant<bool, int64_t, double, std::string>;

struct InferRequestOptions {
  // Version to call; empty: the one the server serves. Default: empty.
  std::string model_version;
  // Echoed back in the response. Default: empty.
  std::string id;
  // Outputs to return ("output0", ...); empty: all. Default: empty.
  std::vector<std::string> outputs;
};

// A request calling `model` with tensor arguments `inputs` (by name, bytes in
// raw_input_contents) and non-tensor arguments `scalars` (request
// parameters). INVALID_ARGUMENT when an input is unnamed, named twice, or
// its bytes do not match its datatype and shape.
absl::StatusOr<inference::ModelInferRequest> MakeInferRequest(
    absl::string_view model, const std::vector<Tensor>& inputs,
    const std::map<std::string, ScalarValue>& scalars = {},
    const InferRequestOptions& options = {});

// What a response says, with its outputs as tensors.
struct InferResult {
  std::string model_name;
  std::string model_version;
  std::string id;
  // precompile-serve's "precompile_outcome": "variant" (a compiled variant
  // ran) or "eager_fallback" (the entry frame ran eagerly); empty when the
  // server did not say (not a precompile-serve server).
  std::string outcome;
  // "precompile_variant": the id of the variant that ran ("forward#0"), or
  // empty.
  std::string variant;
  std::vector<Tensor> outputs;
};

// Reads a response. Outputs may come raw (precompile-serve's way) or in
// typed contents (other KServe servers'). INVALID_ARGUMENT when an output's
// bytes do not match its datatype and shape.
absl::StatusOr<InferResult> ReadInferResponse(const inference::ModelInferResponse& response);

// The response parameter `name` as a string ("" when absent or not a
// string): PrecompileParameter(response, "precompile_outcome").
std::string PrecompileParameter(const inference::ModelInferResponse& response,
                                absl::string_view name);

// The protocol's parameter for a scalar.
inference::InferParameter ToInferParameter(const ScalarValue& value);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_INFER_REQUEST_H_
