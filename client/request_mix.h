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
// (names to return), "sequence". Each template becomes one request, built
// once (random fills drawn once, from the seed) and sent as often as it is
// drawn.
//
// A "sequence" template drives a model that keeps sequences' state (Triton's
// sequence_batching): drawn, it sends a whole sequence of "requests", one
// after the answer to the other, under one new sequence_id, the first with
// sequence_start and the last with sequence_end. The first request is the
// template's; each later one takes "next_inputs" in place of the inputs they
// name, and each input named in "grow" is that much longer in its last
// dimension than in the request before (a decoder's attention mask: one
// position more per token). For a decoder whose server keeps its cache:
//
//   {"name": "generate", "model": "gpt2_decoder_stateful",
//    "inputs": {"input_ids": {"shape": [1, 8], "datatype": "INT64", "fill": "zeros"},
//               "position_ids": {"shape": [1, 8], "datatype": "INT64", "fill": "zeros"},
//               "attention_mask": {"shape": [1, 8], "datatype": "INT64", "fill": "ones"}},
//    "sequence": {"requests": 32,
//                 "next_inputs": {"input_ids": {"shape": [1, 1], "datatype": "INT64",
//                                               "fill": "zeros"},
//                                 "position_ids": {"shape": [1, 1], "datatype": "INT64",
//                                                  "fill": "zeros"}},
//                 "grow": {"attention_mask": 1}}}
//
// (Positions of 0 cost what the right ones do; the tokens are not real.)
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
  // A sequence's requests in order (the first is `request`), with
  // sequence_start and sequence_end set; the sender adds sequence_id.
  // Empty for a template of one request.
  std::vector<std::shared_ptr<const inference::ModelInferRequest>> sequence;
};

// The most requests a sequence template may have, and the most bytes they
// may take together: each is built ahead.
inline constexpr int64_t kMaxSequenceRequests = 1024;
inline constexpr size_t kMaxSequenceBytes = size_t{256} << 20;

// Parses a mix. Relative "npy" paths resolve against `base_directory`.
// INVALID_ARGUMENT names the template and field at fault.
absl::StatusOr<std::vector<RequestTemplate>> ParseRequestMix(
    absl::string_view json, uint64_t seed, const std::string& base_directory = "");

// ParseRequestMix of a file; "npy" paths resolve against its directory.
// NOT_FOUND when it cannot be read.
absl::StatusOr<std::vector<RequestTemplate>> ReadRequestMix(const std::string& path, uint64_t seed);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_REQUEST_MIX_H_
