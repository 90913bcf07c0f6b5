// A request mix for the load generator: weighted request templates read
// from JSON, so that one run exercises variant hits, eager fallbacks and
// refusals together.
//
//   [{"name": "hit", "weight": 8, "model": "mlp",
//     "inputs": {"x": {"shape": [8, 4], "datatype": "FP32", "fill": "random"}},
//     "params": {}},
//    {"name": "eager", "weight": 1, "model": "loop",
//     "inputs": {"x": {"shape": [8, 4], "fill": "random"}}, "params": {"n": 1}},
//    {"name": "refused", "weight": 1, "model": "mlp",
//     "inputs": {"x": {"shape": [1, 4], "fill": "random"}}}]
//
// Fields: "name" (required, unique), "model" (required), "weight" (> 0,
// default 1), "version", "inputs" (tensor specs, see tensor_json.h),
// "params" (non-tensor arguments: bool, int, float or string), "outputs"
// (names to return). Each template becomes one request, built once (random
// fills drawn once, from the seed) and sent as often as it is drawn.
#ifndef PRECOMPILE_CLIENT_REQUEST_MIX_H_
#define PRECOMPILE_CLIENT_REQUEST_MIX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/inference.pb.h"

namespace precompile::client {

struct RequestTemplate {
  std::string name;
  double weight = 1;
  std::string model;
  std::shared_ptr<const inference::ModelInferRequest> request;
};

// Parses a mix. Relative "npy" paths resolve against `base_directory`.
// INVALID_ARGUMENT names the template and field at fault.
absl::StatusOr<std::vector<RequestTemplate>> ParseRequestMix(
    absl::string_view json, uint64_t seed, const std::string& base_directory = "");

// ParseRequestMix of a file; "npy" paths resolve against its directory.
// NOT_FOUND when it cannot be read.
absl::StatusOr<std::vector<RequestTemplate>> ReadRequestMix(const std::string& path, uint64_t seed);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_REQUEST_MIX_H_
