// Protocol buffer messages to and from the bytes gRPC's raw and generic
// methods take and give: the services that bound a request's size before it
// is parsed parse it here.
#ifndef PRECOMPILE_SERVER_GRPC_MESSAGE_BYTES_H_
#define PRECOMPILE_SERVER_GRPC_MESSAGE_BYTES_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "google/protobuf/message.h"

namespace precompile::server {

// `bytes` parsed into `message`; INVALID_ARGUMENT naming the message's type
// if they do not parse. Reads the buffer's slices without copying them.
grpc::Status ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);

// `message` serialized into `bytes`.
void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* bytes);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_MESSAGE_BYTES_H_
