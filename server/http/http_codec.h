// The KServe v2 HTTP/REST protocol's bodies, to and from the
// protos of server/api/inference_api.h: what the HTTP endpoint
// (server/http/http_service.h) needs that does not touch a socket.
//
// Tensors travel as JSON ("data": [...], flat or nested, row-major) or, with
// Triton's binary tensor data extension, as bytes after the JSON: the
// request's Inference-Header-Content-Length header gives the JSON's length,
// and each input with the parameter "binary_data_size" takes that many
// bytes, in the order of the inputs. An output is sent as bytes when the
// request asks for it ("parameters": {"binary_data": true} on the output,
// or "binary_data_output": true on the request); the response then has an
// Inference-Header-Content-Length of its own.
//
// An input's "data" is written into its tensor as the JSON streams by, not
// parsed into a tree first (which costs many times the text): values before
// the input's "datatype" and "shape" are kept as JSON up to 2^20, values
// outside the inputs' data are capped at 100000, and a run of brackets,
// commas and blanks at 64 KiB.
//
// JSON numbers become each datatype's values with their range checked: an
// integer for an integer type, true/false for BOOL; FP16 and BF16 are
// rounded to nearest even from the number. Output floats are printed with
// the digits that read back the same value; NaN and the infinities, which
// JSON has no literal for, as the strings "NaN", "Infinity", "-Infinity".
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_SERVER_HTTP_HTTP_CODEC_H_
#define PRECOMPILE_SERVER_HTTP_HTTP_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"
#include "runtime/value.h"

namespace precompile::server {

// The HTTP status for a failed call, as Google's APIs map them:
// INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE 400; NOT_FOUND 404;
// RESOURCE_EXHAUSTED 429; UNAVAILABLE 503; DEADLINE_EXCEEDED 504; ...
int HttpStatusOf(absl::StatusCode code);

// The KServe error body: {"error": "<message>"}.
std::string ErrorBody(absl::string_view message);

// The value of an Inference-Header-Content-Length header for a body of
// `body_size` bytes: INVALID_ARGUMENT unless it is a decimal number no
// larger than the body.
absl::StatusOr<size_t> ParseHeaderLength(absl::string_view value, size_t body_size);

// Decodes an infer request: `body` is all JSON when `header_length` is
// empty, else its first *header_length bytes are, and the rest the inputs'
// binary data. Every input arrives in raw_input_contents; the outputs keep
// their "binary_data" parameter and the request its "binary_data_output",
// for EncodeInferResponse. `model` and `version` come from the path.
// INVALID_ARGUMENT names the field and the problem; no tensor storage is
// allocated before the shapes, datatypes and byte counts agree.
absl::Status DecodeInferRequest(absl::string_view body, std::optional<size_t> header_length,
                                const std::string& model, const std::string& version,
                                inference::ModelInferRequest* request);

// An encoded infer response. `header_length` is set when binary output
// data follows the JSON in `body`. An output SentFromTensor
// (server/api/tensor_codec.h) is not copied: `body` holds its tensor.
struct HttpInferResponse {
  absl::Cord body;
  std::optional<size_t> header_length;
};

// Encodes `response` (outputs described, no contents) with `outputs`' values,
// in the order of response.outputs(); `request` says which go as binary.
HttpInferResponse EncodeInferResponse(const inference::ModelInferRequest& request,
                                      const inference::ModelInferResponse& response,
                                      const std::vector<OutputTensor>& outputs);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_HTTP_HTTP_CODEC_H_
