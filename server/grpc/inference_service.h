// The KServe v2 / Open Inference Protocol over gRPC: the transport for
// server/api/inference_api.h, which says what each method means.
//
// ModelInfer runs on gRPC's asynchronous API with the service's own threads,
// `pollers` of them taking calls from one completion queue; each call is
// submitted to the request scheduler (server/scheduling/request_scheduler.h), which
// admits it, runs it on the thread that took it when a run slot is free, or
// queues it. There are more pollers than run slots, so that some are always
// free to take calls (and to refuse them at the server's limit). The other
// methods are served through a UnaryCallRouter (server/grpc/unary_call_router.h),
// on threads of its own: a long model call never holds up metadata, and
// their requests are refused past a few KiB before they are parsed.
//
// An answer stays in memory until its client has taken it whole, which a
// client that grants no flow-control window never does (gRPC's own quota
// does not reliably bound what it holds to send). So the service counts
// the bytes of the answers handed to gRPC and not yet sent: past
// `AnswerLimits::max_unsent_bytes`, new calls are refused
// (RESOURCE_EXHAUSTED, naming the limit) before they are admitted; and an
// answer not taken whole within `AnswerLimits::timeout` is dropped, its call
// cancelled (by DropUntakenAnswers), so that such a client holds the budget
// for a bounded time.
//
// Thread safety: gRPC calls the methods concurrently.
#ifndef PRECOMPILE_SERVER_GRPC_INFERENCE_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_INFERENCE_SERVICE_H_

#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/inference.grpc.pb.h"
#include "server/api/control_access.h"
#include "server/api/inference_api.h"
#include "server/grpc/call_queue.h"
#include "server/grpc/unary_call_router.h"
#include "server/scheduling/request_scheduler.h"

namespace precompile::server {

// What answers waiting for their clients may hold (see above); zero for
// either: no limit.
struct AnswerLimits {
  int64_t max_unsent_bytes = 0;
  absl::Duration timeout = absl::ZeroDuration();
};

class InferenceService final
    : public inference::GRPCInferenceService::WithRawMethod_ModelInfer<
          inference::GRPCInferenceService::Service> {
 public:
  // The references must outlive the service. `access` guards
  // RepositoryModelLoad/Unload and changes of TraceSetting
  // (ControlAccess::CheckControl).
  // REQUIRES: scheduler.run_slots() < pollers.
  InferenceService(InferenceApi& api, RequestScheduler& scheduler, ControlAccess access,
                   int pollers, AnswerLimits answers = {});
  // Stops serving (see StopServing): the gRPC server must be shut down first.
  ~InferenceService() override;

  // Routes the methods other than ModelInfer (which gRPC leaves to the
  // router's generic service) to this service.
  void RouteUnaryCalls(UnaryCallRouter& router);
  // inference.GRPCInferenceService.
  static const google::protobuf::ServiceDescriptor& Described();

  // Where gRPC does not end TLS itself (the server's front does): the
  // certificate the client of the connection gRPC names `grpc_peer`
  // presented. Set before StartServing.
  using ClientCertificates = std::function<std::string(absl::string_view grpc_peer)>;
  void SetClientCertificates(ClientCertificates certificates) {
    client_certificates_ = std::move(certificates);
  }
  // Starts answering ModelInfer from `cq`, a completion queue of the server
  // this service is registered with.
  void StartServing(std::unique_ptr<grpc::ServerCompletionQueue> cq);
  // After the gRPC server has shut down: finishes the requests still queued
  // or running and joins the threads. Idempotent.
  void StopServing();

  // Bytes of the answers handed to gRPC that their clients have not taken
  // whole yet.
  int64_t unsent_answer_bytes() const { return unsent_answer_bytes_.load(); }
  // Cancels the calls whose answers have waited for their clients
  // AnswerLimits::timeout or longer by `now`: the server calls it every
  // second or so while it serves.
  void DropUntakenAnswers(absl::Time now) ABSL_LOCKS_EXCLUDED(unsent_mu_);

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
  // Reading needs nothing; changing settings, what loading a model needs.
  grpc::Status TraceSetting(grpc::ServerContext*, const inference::TraceSettingRequest*,
                            inference::TraceSettingResponse*) override;

 private:
  class InferCall;

  // Each thread's loop over the completion queue, and what it does with each
  // kind of event.
  void ServeCalls();
  void OnRequested(InferCall* call);
  void RequestCall();
  // Sends what the call's run decided.
  void Answer(InferCall* call);
  // The call's answer went out, or will not: what it held is given back.
  void OnAnswered(InferCall* call) ABSL_LOCKS_EXCLUDED(unsent_mu_);
  void Delete(InferCall* call);

  InferenceApi& api_;
  RequestScheduler& scheduler_;
  const ControlAccess access_;

  const int pollers_;
  const AnswerLimits answer_limits_;
  ClientCertificates client_certificates_;
  std::atomic<int64_t> unsent_answer_bytes_{0};
  // The calls whose answers wait for their clients, oldest first (those
  // answered while a timeout is set).
  std::mutex unsent_mu_;
  InferCall* oldest_unsent_ ABSL_GUARDED_BY(unsent_mu_) = nullptr;
  InferCall* newest_unsent_ ABSL_GUARDED_BY(unsent_mu_) = nullptr;
  // Calls are requested until StopServing; each ends when it is deleted.
  CallQueue calls_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_INFERENCE_SERVICE_H_
