// The KServe v2 / Open Inference Protocol gRPC service, with the Triton
// extensions that standard clients and load testers rely on (ModelConfig,
// ModelStatistics, RepositoryIndex, RepositoryModelLoad/Unload).
//
// A model's inputs are its entry frame's tensor arguments, by name; its
// non-tensor arguments travel as request parameters. Outputs are the tensor
// leaves of what the entry returns, named by their path (last_hidden_state,
// pooled.0; output0, output1, ... for a tensor or a flat tuple). Each
// response carries two parameters saying how the entry frame was served:
// "precompile_outcome" ("variant" or "eager_fallback") and
// "precompile_variant" (the variant's id, or "").
//
// ModelInfer runs on gRPC's asynchronous API with the service's own threads,
// `pollers` of them taking calls from one completion queue; each call is
// submitted to the request scheduler (server/request_scheduler.h), which
// admits it, runs it on the thread that took it when a run slot is free, or
// queues it. There are more pollers than run slots, so that some are always
// free to take calls (and to refuse them at the server's limit). The other
// methods are synchronous (gRPC's threads): a long model call never holds up
// health checks or metadata.
//
// Thread safety: gRPC calls the methods concurrently; the service's own
// state is the serving state it shares with the server.
#ifndef PRECOMPILE_SERVER_INFERENCE_SERVICE_H_
#define PRECOMPILE_SERVER_INFERENCE_SERVICE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "proto/inference.grpc.pb.h"
#include "server/metrics.h"
#include "server/control_access.h"
#include "server/model_repository.h"
#include "server/request_scheduler.h"
#include "server/serving_state.h"

namespace precompile::server {

class InferenceService final
    : public inference::GRPCInferenceService::WithRawMethod_ModelInfer<
          inference::GRPCInferenceService::Service> {
 public:
  // All references must outlive the service. `metrics` may be null.
  // `access` guards RepositoryModelLoad/Unload (ControlAccess::CheckControl).
  // REQUIRES: scheduler.run_slots() < pollers.
  InferenceService(ModelRepository& repository, ServerMetrics* metrics,
                   ServingState& state, RequestScheduler& scheduler, ControlAccess access,
                   int pollers);
  // Stops serving (see StopServing): the gRPC server must be shut down first.
  ~InferenceService() override;

  // Starts answering ModelInfer from `cq`, a completion queue of the server
  // this service is registered with.
  void StartServing(std::unique_ptr<grpc::ServerCompletionQueue> cq);
  // After the gRPC server has shut down: finishes the requests still queued
  // or running and joins the threads. Idempotent.
  void StopServing();

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
  class InferCall;

  // Each thread's loop over the completion queue, and what it does with each
  // kind of event.
  void ServeCalls();
  void OnRequested(InferCall* call);
  void RequestCall();
  // Sends what RunAdmitted decided for `call`.
  void Answer(InferCall* call);
  void Delete(InferCall* call);
  // Runs an admitted call's request and records it; on success, `*response`
  // is what to send.
  grpc::Status RunAdmitted(InferCall* call, grpc::ByteBuffer* response);
  // Parses `raw_request` into `request` and runs it: on success,
  // `*response` is what to send. Fills `timing` from `received` on.
  absl::Status Infer(grpc::ServerContext* context, grpc::ByteBuffer* raw_request,
                     absl::Time received, inference::ModelInferRequest* request,
                     grpc::ByteBuffer* response, RequestOutcome* outcome,
                     ModelRepository::Handle* handle, RequestTiming* timing);

  // Logs a failed request, at most once a minute per model and status code:
  // one line per class of failure, the rest are counted in the metrics.
  void LogFailure(const std::string& model, const absl::Status& status)
      ABSL_LOCKS_EXCLUDED(log_mu_);

  ModelRepository& repository_;
  ServerMetrics* const metrics_;
  ServingState& state_;
  RequestScheduler& scheduler_;
  const ControlAccess access_;
  std::mutex log_mu_;
  absl::flat_hash_map<std::string, absl::Time> last_logged_ ABSL_GUARDED_BY(log_mu_);

  const int pollers_;
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> threads_;
  // Calls are requested until StopServing, which waits for the requests
  // being made before it shuts the completion queue down.
  std::atomic<bool> stopping_{false};
  std::atomic<int> requesting_{0};
  // Calls requested and not yet deleted.
  std::atomic<int> live_calls_{0};
  bool stopped_ = false;  // Only the controlling thread calls StopServing.
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_INFERENCE_SERVICE_H_
