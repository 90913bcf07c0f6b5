// The KServe v2 / Open Inference Protocol gRPC service, with the Triton
// extensions that standard clients and load testers rely on (ModelConfig,
// ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload).
//
// A model's inputs are its entry frame's tensor arguments, by name; its
// non-tensor arguments travel as request parameters. Outputs are named
// output0, output1, ... Each response carries two parameters saying how the
// entry frame was served: "precompile_outcome" ("variant" or
// "eager_fallback") and "precompile_variant" (the variant's id, or "").
//
// Thread safety: gRPC calls the methods concurrently; the service's own
// state is the serving state it shares with the server.
#ifndef PRECOMPILE_SERVER_INFERENCE_SERVICE_H_
#define PRECOMPILE_SERVER_INFERENCE_SERVICE_H_

#include <atomic>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "proto/inference.grpc.pb.h"
#include "server/metrics.h"
#include "server/model_repository.h"
#include "server/serving_state.h"

namespace precompile::server {

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  // All references must outlive the service. `metrics` may be null.
  // `admin_token` guards RepositoryModelLoad/Unload (see CheckAdminToken).
  InferenceService(ModelRepository& repository, ServerMetrics* metrics,
                   ServingState& state, std::string admin_token);

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse*) override;
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse*) override;
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest*,
                          inference::ModelReadyResponse*) override;
  grpc::Status ServerMetadata(grpc::ServerContext*,
                              const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse*) override;
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest*,
                             inference::ModelMetadataResponse*) override;
  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest*,
                          inference::ModelInferResponse*) override;
  grpc::Status ModelConfig(grpc::ServerContext*, const inference::ModelConfigRequest*,
                           inference::ModelConfigResponse*) override;
  grpc::Status ModelStatistics(grpc::ServerContext*,
                               const inference::ModelStatisticsRequest*,
                               inference::ModelStatisticsResponse*) override;
  grpc::Status RepositoryIndex(grpc::ServerContext*,
                               const inference::RepositoryIndexRequest*,
                               inference::RepositoryIndexResponse*) override;
  grpc::Status RepositoryModelLoad(grpc::ServerContext*,
                                   const inference::RepositoryModelLoadRequest*,
                                   inference::RepositoryModelLoadResponse*) override;
  grpc::Status RepositoryModelUnload(grpc::ServerContext*,
                                     const inference::RepositoryModelUnloadRequest*,
                                     inference::RepositoryModelUnloadResponse*) override;

 private:
  absl::Status Infer(grpc::ServerContext* context, const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response, RequestOutcome* outcome,
                     ModelRepository::Handle* handle, RequestTiming* timing);

  // Logs a failed request, at most once a minute per model and status code:
  // one line per class of failure, the rest are counted in the metrics.
  void LogFailure(const std::string& model, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(log_mu_);

  ModelRepository& repository_;
  ServerMetrics* const metrics_;
  ServingState& state_;
  const std::string admin_token_;
  std::mutex log_mu_;
  absl::flat_hash_map<std::string, absl::Time> last_logged_ ABSL_GUARDED_BY(log_mu_);
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_INFERENCE_SERVICE_H_
