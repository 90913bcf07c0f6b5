// ModelInfer's response on the wire, with the output tensors' bytes sent
// from where the model left them.
//
// Through the generated code each output's bytes were copied twice: into the
// message's raw_output_contents, and the message into gRPC's buffer. Here
// the message without them is serialized once, and each output follows it
// as one more raw_output_contents field (a parser takes a message's fields
// in any order, and a repeated field's elements in the order they come).
// An output SentFromTensor (server/api/tensor_codec.h) is a gRPC slice that
// refers to the tensor and holds it until gRPC is done with it; a smaller one
// is copied next to the message.
#ifndef PRECOMPILE_SERVER_GRPC_INFER_RESPONSE_H_
#define PRECOMPILE_SERVER_GRPC_INFER_RESPONSE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <vector>

#include "proto/inference.pb.h"
#include "runtime/value.h"
#include "server/api/tensor_codec.h"

namespace precompile::server {

// The wire bytes of `response` with `outputs`' bytes as its
// raw_output_contents, in order. An output without an owner is copied.
// REQUIRES: response.raw_output_contents() is empty.
grpc::ByteBuffer SerializeInferResponse(const inference::ModelInferResponse& response,
                                        const std::vector<OutputTensor>& outputs);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_INFER_RESPONSE_H_
