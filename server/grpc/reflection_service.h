// gRPC server reflection (grpc.reflection.v1alpha: what grpcurl and grpc_cli
// ask), answered from the descriptors compiled into the server.
//
// gRPC's own reflection service is synchronous: each open stream holds one
// of the server's threads for as long as its client keeps it open, so a
// client that opens streams and sends nothing makes the server start a
// thread for each (3000 streams, 3000 threads; enough of them exhaust the
// process's threads). This one runs on gRPC's callback API: an open stream
// holds only its memory, and at most `max_streams` are open at once; a
// stream past that is refused RESOURCE_EXHAUSTED when it opens. Requests
// arrive as bytes: one of more than 4 KiB is answered with an error without
// being parsed (gRPC takes messages up to --max_message_bytes, for
// ModelInfer's sake).
//
// Thread safety: gRPC calls it from its threads; answers read only the
// generated descriptor pool, which does not change.
#ifndef PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <string>
#include <vector>

#include "proto/reflection.grpc.pb.h"

namespace precompile::server {

using ReflectionServiceBase =
    grpc::reflection::v1alpha::ServerReflection::WithRawCallbackMethod_ServerReflectionInfo<
        grpc::reflection::v1alpha::ServerReflection::Service>;

class ReflectionService final : public ReflectionServiceBase {
 public:
  // `services`: the full names of the services the server offers, listed as
  // given (this one's own included). REQUIRES: max_streams >= 1.
  ReflectionService(std::vector<std::string> services, int max_streams);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override;

  int open_streams() const { return open_streams_.load(); }

 private:
  class Stream;
  class Refusal;

  // The answer to one request as it came, serialized into `answer`.
  void AnswerBytes(const grpc::ByteBuffer& request, grpc::ByteBuffer* answer) const;
  // The answer to one request: a file and those it imports (each once), the
  // services, a type's extension numbers, or an error (NOT_FOUND for a name
  // the server does not know; UNIMPLEMENTED for a request of no known kind).
  grpc::reflection::v1alpha::ServerReflectionResponse Answer(
      const grpc::reflection::v1alpha::ServerReflectionRequest& request) const;

  const std::vector<std::string> services_;
  const int max_streams_;
  std::atomic<int> open_streams_{0};
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_
