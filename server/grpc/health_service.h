// The gRPC health checking protocol (grpc.health.v1: Check and Watch), which
// Kubernetes' gRPC probes, grpc_health_probe and load balancers ask.
//
// gRPC's built-in service parses whatever gRPC takes (--max_message_bytes,
// for ModelInfer's sake): 16 Checks naming a service of 200 MB grew the
// server by 755 MiB. This one takes each request as bytes and refuses one of
// more than 4 KiB unparsed (RESOURCE_EXHAUSTED), on gRPC's callback API, so
// that an open Watch holds no thread. At most `max_watches` Watch streams
// are open at once (each is memory its client holds as long as it likes);
// past it, a Watch is refused (RESOURCE_EXHAUSTED).
//
// Statuses: "" is the whole server; a model's name, that model. A service
// never set is unknown (Check: NOT_FOUND; Watch: SERVICE_UNKNOWN until it is
// set). Shutdown (before the gRPC server shuts down) makes every status
// NOT_SERVING for good and ends the Watch streams once their clients have
// been told, so that they do not hold up the server's shutdown.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_SERVER_GRPC_HEALTH_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_HEALTH_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "proto/health.grpc.pb.h"

namespace precompile::server {

using HealthServiceBase = grpc::health::v1::Health::WithRawCallbackMethod_Check<
    grpc::health::v1::Health::WithRawCallbackMethod_Watch<grpc::health::v1::Health::Service>>;

class HealthService final : public HealthServiceBase {
 public:
  explicit HealthService(int max_watches);
  // REQUIRES: no call is being answered (the gRPC server has shut down).
  ~HealthService() override;

  void SetServingStatus(const std::string& service, bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request) override;

 private:
  class Watcher;
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;

  Status StatusOf(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Watch stream ended.
  void Forget(Watcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);

  const int max_watches_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Each open Watch stream and the service it watches.
  absl::flat_hash_map<Watcher*, std::string> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_HEALTH_SERVICE_H_
