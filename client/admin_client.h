// A client of precompile-serve's admin service (precompile.v1.PrecompileAdmin):
// what an artifact covers (summary, FRAMES list, per-frame coverage, eager
// fallback warnings) and control of the model repository.
//
// Every call sends the admin token when ClientOptions has one (a server
// started with --admin_token_file refuses admin calls without it:
// UNAUTHENTICATED). Reading calls are retried on UNAVAILABLE under the
// RetryPolicy, by gRPC (retry.h); LoadModel, UnloadModel and Rescan run
// once. NOT_FOUND names an unknown model.
//
// Thread safety: all methods may be called concurrently.
#ifndef PRECOMPILE_CLIENT_ADMIN_CLIENT_H_
#define PRECOMPILE_CLIENT_ADMIN_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/client_options.h"
#include "client/retry.h"
#include "proto/admin.grpc.pb.h"

namespace precompile::client {

class AdminClient {
 public:
  // As InferenceClient::Create.
  static absl::StatusOr<std::unique_ptr<AdminClient>> Create(
      const ClientOptions& options, std::shared_ptr<grpc::Channel> channel = nullptr);

  absl::StatusOr<precompile::v1::ListModelsResponse> ListModels(const CallOptions& call = {});
  absl::StatusOr<precompile::v1::SummaryResponse> GetSummary(const std::string& model,
                                                             const CallOptions& call = {});
  absl::StatusOr<precompile::v1::FramesResponse> GetFrames(const std::string& model,
                                                           const CallOptions& call = {});
  absl::StatusOr<precompile::v1::CoverageResponse> GetCoverage(const std::string& model,
                                                               const CallOptions& call = {});
  absl::StatusOr<precompile::v1::WarningsResponse> ListWarnings(const std::string& model,
                                                                const CallOptions& call = {});
  // `version` 0: the newest version served.
  absl::StatusOr<precompile::v1::MissesResponse> Misses(const std::string& model,
                                                        int64_t version = 0,
                                                        const CallOptions& call = {});
  absl::StatusOr<precompile::v1::LoadModelResponse> LoadModel(const std::string& model,
                                                              const CallOptions& call = {});
  absl::StatusOr<precompile::v1::UnloadModelResponse> UnloadModel(const std::string& model,
                                                                  const CallOptions& call = {});
  absl::StatusOr<precompile::v1::RescanResponse> Rescan(const CallOptions& call = {});

 private:
  using Stub = precompile::v1::PrecompileAdmin::Stub;
  // A channel and the stub on it.
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<Stub> admin;
  };
  static Stubs StubsOn(std::shared_ptr<grpc::Channel> channel);

  AdminClient(const ClientOptions& options, std::unique_ptr<PerAttemptCount<Stubs>> stubs);
  // One unary admin RPC. When `retried`, on the channel whose retry policy
  // makes the call's attempts; else on the client's own, where the method
  // has none.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                             Response*),
                                const Request& request, bool retried, const CallOptions& call);

  const ClientOptions options_;
  const std::unique_ptr<PerAttemptCount<Stubs>> stubs_;
};

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_ADMIN_CLIENT_H_
