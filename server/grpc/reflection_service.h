// gRPC server reflection (grpc.reflection.v1alpha: what grpcurl and grpc_cli
// ask), answered from the descriptors compiled into the server.
//
// gRPC's own reflection service is synchronous: each open stream holds one
// of the server's threads for as long as its client keeps it open, so a
// client that opens streams and sends nothing makes the server start a
// thread for each (3000 streams, 3000 threads; enough of them exhaust the
// process's threads). This one runs on gRPC's callback API: an open stream
// holds only its memory, and at most `max_streams` are open at once; a
// stream past that is refused RESOURCE_EXHAUSTED when it opens. A stream
// that has asked nothing for `idle_timeout` is ended (UNAVAILABLE), so that
// a client cannot keep every slot for ever. Requests
// arrive as bytes: one of more than 4 KiB is answered with an error without
// being parsed (gRPC takes messages up to --max_message_bytes, for
// ModelInfer's sake).
//
// Thread safety: gRPC calls it from its threads; answers read only the
// generated descriptor pool, which does not change. One thread of its own
// ends idle streams.
#ifndef PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/notification.h"

#include "proto/reflection.grpc.pb.h"

namespace precompile::server {

using ReflectionServiceBase =
    grpc::reflection::v1alpha::ServerReflection::WithRawCallbackMethod_ServerReflectionInfo<
        grpc::reflection::v1alpha::ServerReflection::Service>;

class ReflectionService final : public ReflectionServiceBase {
 public:
  // `services`: the full names of the services the server offers, listed as
  // given (this one's own included). REQUIRES: max_streams >= 1,
  // idle_timeout > 0.
  ReflectionService(std::vector<std::string> services, int max_streams,
                    absl::Duration idle_timeout);
  // REQUIRES: no stream is open (the gRPC server has shut down).
  ~ReflectionService() override;

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

  // Until stopped: ends the streams idle for idle_timeout_ or longer.
  void EndIdleStreams() ABSL_LOCKS_EXCLUDED(streams_mu_);
  void Forget(Stream* stream) ABSL_LOCKS_EXCLUDED(streams_mu_);

  const std::vector<std::string> services_;
  const int max_streams_;
  const absl::Duration idle_timeout_;
  std::atomic<int> open_streams_{0};
  std::mutex streams_mu_;
  std::unordered_set<Stream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  Notification stop_;
  std::thread idle_ender_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_REFLECTION_SERVICE_H_
