#include "server/grpc/message_bytes.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include "absl/strings/str_cat.h"

namespace precompile::server {

grpc::Status ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message* message) {
  grpc::ByteBuffer view(bytes);  // Shares the slices: ProtoBufferReader takes a mutable buffer.
  grpc::ProtoBufferReader reader(&view);
  if (!message->ParseFromZeroCopyStream(&reader)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("the request is not a ", message->GetDescriptor()->name(),
                                     " (it does not parse)"));
  }
  return grpc::Status::OK;
}

void SerializeMessage(const google::protobuf::Message& message, grpc::ByteBuffer* bytes) {
  bool own_buffer = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(message, bytes,
                                                                             &own_buffer);
}

}  // namespace precompile::server
