#include "server/grpc/inference_service.h"

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "server/api/inference_job.h"
#include "server/grpc/call_queue.h"
#include "server/grpc/grpc_status.h"
#include "server/grpc/infer_response.h"
#include "server/grpc/message_bytes.h"

namespace precompile::server {

// One ModelInfer call on gRPC's asynchronous API. Its events: `requested`
// (a call arrived, or ok=false: the server shut down first), then both
// `answered` (the response went out, or ok=false: it will not) and `done`
// (the call ended; it is what makes IsCancelled() a cheap read), in either
// order, on any thread. Once a call arrived, three parties hold it: the
// thread that answers it (until Finish returns) and the two events; the
// last to let go deletes it (they synchronise through Unref, TSan included).
class InferenceService::InferCall final : public InferenceJob {
 public:
  enum class Event { kRequested, kAnswered, kDone };
  struct Tag {
    InferCall* call;
    Event event;
  };

  explicit InferCall(InferenceService* service)
      : InferenceJob(service->api_), responder(&context), service_(service) {
    context.AsyncNotifyWhenDone(&done_);
  }

  void Complete() override { service_->Answer(this); }

  absl::Status Parse(inference::ModelInferRequest* request) override {
    // The one copy of the input bytes: out of gRPC's buffer into the message.
    const grpc::Status parsed = ParseMessage(raw_request, request);
    // The call may live on long after (its answer waiting for its client):
    // it keeps no second copy of its inputs.
    raw_request.Clear();
    return parsed.ok() ? absl::OkStatus() : absl::InvalidArgumentError(parsed.error_message());
  }
  // With AsyncNotifyWhenDone this reads a flag.
  bool Cancelled() override { return context.IsCancelled(); }
  std::string ClientCertificate() override {
    if (const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context()) {
      const std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
      if (!pem.empty()) return std::string(pem.front().data(), pem.front().size());
    }
    return service_->client_certificates_ ? service_->client_certificates_(context.peer())
                                          : std::string();
  }
  absl::Status Encode(const inference::ModelInferResponse& message,
                      std::vector<OutputTensor>& outputs) override {
    response = SerializeInferResponse(message, outputs);
    return absl::OkStatus();
  }

  static std::pair<InferCall*, Event> Of(void* tag) {
    const Tag* t = static_cast<const Tag*>(tag);
    return {t->call, t->event};
  }
  void* requested_tag() { return &requested_; }
  void* answered_tag() { return &answered_; }
  std::array<void*, 3> tags() { return {&requested_, &answered_, &done_}; }
  // True for the last holder to let go.
  bool Unref() { return holders_.fetch_sub(1, std::memory_order_acq_rel) == 1; }

  grpc::ServerContext context;
  // The request as it came: parsed when it runs, so that a request that does
  // not parse is refused like any other invalid one.
  grpc::ByteBuffer raw_request;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder;
  grpc::ByteBuffer response;
  // Its answer's share of the service's unsent answer bytes.
  int64_t unsent_bytes = 0;
  // Its place among the answers waiting to be taken, while it is there
  // (guarded by the service's unsent_mu_).
  absl::Time answer_ready;
  InferCall* older_unsent = nullptr;
  InferCall* newer_unsent = nullptr;
  bool waits_unsent = false;
  using InferenceJob::answer;
  using InferenceJob::set_received;

 private:
  InferenceService* const service_;
  Tag requested_{this, Event::kRequested};
  Tag answered_{this, Event::kAnswered};
  Tag done_{this, Event::kDone};
  std::atomic<int> holders_{3};
};

InferenceService::InferenceService(InferenceApi& api, RequestScheduler& scheduler,
                                   ControlAccess access, int pollers, AnswerLimits answers)
    : api_(api),
      scheduler_(scheduler),
      access_(std::move(access)),
      pollers_(pollers),
      answer_limits_(answers) {
  // gRPC leaves a method marked generic to the server's generic service:
  // every method but ModelInfer is the router's (RouteUnaryCalls).
  const google::protobuf::ServiceDescriptor& service = Described();
  for (int i = 0; i < service.method_count(); ++i) {
    if (service.method(i)->name() != "ModelInfer") MarkMethodGeneric(i);
  }
}

const google::protobuf::ServiceDescriptor& InferenceService::Described() {
  return *google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      inference::GRPCInferenceService::service_full_name());
}

void InferenceService::RouteUnaryCalls(UnaryCallRouter& router) {
  const google::protobuf::ServiceDescriptor& service = Described();
  router.Add(service, "ServerLive", this, &InferenceService::ServerLive);
  router.Add(service, "ServerReady", this, &InferenceService::ServerReady);
  router.Add(service, "ModelReady", this, &InferenceService::ModelReady);
  router.Add(service, "ServerMetadata", this, &InferenceService::ServerMetadata);
  router.Add(service, "ModelMetadata", this, &InferenceService::ModelMetadata);
  router.Add(service, "ModelConfig", this, &InferenceService::ModelConfig);
  router.Add(service, "ModelStatistics", this, &InferenceService::ModelStatistics);
  router.Add(service, "RepositoryIndex", this, &InferenceService::RepositoryIndex);
  // The repository loads and unloads one model at a time; a call without
  // the right to is refused before it waits.
  using Lane = UnaryCallRouter::Lane;
  auto may_control = [this](const grpc::ServerContext& context) {
    return access_.CheckControl(context);
  };
  router.Add(service, "RepositoryModelLoad", this, &InferenceService::RepositoryModelLoad,
             Lane::kOneAtATime, may_control);
  router.Add(service, "RepositoryModelUnload", this, &InferenceService::RepositoryModelUnload,
             Lane::kOneAtATime, may_control);
  router.Add(service, "TraceSetting", this, &InferenceService::TraceSetting);
}

InferenceService::~InferenceService() { StopServing(); }

void InferenceService::StartServing(std::unique_ptr<grpc::ServerCompletionQueue> cq) {
  calls_.Start(std::move(cq), pollers_, [this] { ServeCalls(); });
  for (int i = 0; i < 2 * pollers_; ++i) RequestCall();
}

void InferenceService::StopServing() { calls_.Stop(); }

void InferenceService::RequestCall() {
  calls_.RequestCall([this] {
    auto* call = new InferCall(this);
    // Its tags go to gRPC now (the done tag with the request) or later, and
    // come back on any thread.
    for (void* tag : call->tags()) HandToGrpc(tag);
    RequestModelInfer(&call->context, &call->raw_request, &call->responder, calls_.queue(),
                      calls_.queue(), call->requested_tag());
  });
}

void InferenceService::ServeCalls() {
  void* tag = nullptr;
  bool ok = false;
  while (calls_.queue()->Next(&tag, &ok)) {
    TakeFromGrpc(tag);
    auto [call, event] = InferCall::Of(tag);
    if (event == InferCall::Event::kAnswered) OnAnswered(call);
    if (event != InferCall::Event::kRequested) {
      if (call->Unref()) Delete(call);
    } else if (!ok) {
      Delete(call);  // The server shut down before a call arrived.
    } else {
      RequestCall();
      OnRequested(call);
    }
  }
}

void InferenceService::OnRequested(InferCall* call) {
  call->set_received(absl::Now());
  const int64_t unsent = unsent_answer_bytes_.load(std::memory_order_relaxed);
  const absl::Status admitted =
      answer_limits_.max_unsent_bytes > 0 && unsent >= answer_limits_.max_unsent_bytes
          ? absl::ResourceExhaustedError(absl::StrCat(
                "answers not yet taken by their clients hold ", unsent,
                " bytes, at the limit of ", answer_limits_.max_unsent_bytes,
                " (--grpc_unsent_answer_bytes); retry later"))
          : scheduler_.Submit(call, static_cast<int64_t>(call->raw_request.Length()));
  if (!admitted.ok()) {
    call->raw_request.Clear();
    call->responder.FinishWithError(ToGrpcStatus(admitted), call->answered_tag());
    if (call->Unref()) Delete(call);
  }
}

void InferenceService::Answer(InferCall* call) {
  if (call->answer().ok()) {
    call->unsent_bytes = static_cast<int64_t>(call->response.Length());
    unsent_answer_bytes_.fetch_add(call->unsent_bytes, std::memory_order_relaxed);
    if (answer_limits_.timeout > absl::ZeroDuration()) {
      // Before the answer goes, so that `answered` always finds it there.
      std::lock_guard<std::mutex> lock(unsent_mu_);
      call->answer_ready = absl::Now();
      call->waits_unsent = true;
      call->older_unsent = newest_unsent_;
      (newest_unsent_ ? newest_unsent_->newer_unsent : oldest_unsent_) = call;
      newest_unsent_ = call;
    }
    HandToGrpc(call->answered_tag());  // What OnAnswered reads was set here.
    call->responder.Finish(call->response, grpc::Status::OK, call->answered_tag());
  } else {
    call->responder.FinishWithError(ToGrpcStatus(call->answer()), call->answered_tag());
  }
  if (call->Unref()) Delete(call);
}

void InferenceService::OnAnswered(InferCall* call) {
  unsent_answer_bytes_.fetch_sub(call->unsent_bytes, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(unsent_mu_);
  if (!call->waits_unsent) return;
  call->waits_unsent = false;
  (call->older_unsent ? call->older_unsent->newer_unsent : oldest_unsent_) = call->newer_unsent;
  (call->newer_unsent ? call->newer_unsent->older_unsent : newest_unsent_) = call->older_unsent;
}

void InferenceService::DropUntakenAnswers(absl::Time now) {
  if (answer_limits_.timeout <= absl::ZeroDuration()) return;
  // A call stays listed (so alive) until its `answered` event, which
  // cancelling it brings.
  std::lock_guard<std::mutex> lock(unsent_mu_);
  for (InferCall* call = oldest_unsent_;
       call != nullptr && now - call->answer_ready >= answer_limits_.timeout;
       call = call->newer_unsent) {
    call->context.TryCancel();
  }
}

void InferenceService::Delete(InferCall* call) {
  delete call;
  calls_.CallEnded();
}

grpc::Status InferenceService::ServerLive(grpc::ServerContext*,
                                          const inference::ServerLiveRequest*,
                                          inference::ServerLiveResponse* response) {
  response->set_live(api_.ServerLive());
  return grpc::Status::OK;
}

grpc::Status InferenceService::ServerReady(grpc::ServerContext*,
                                           const inference::ServerReadyRequest*,
                                           inference::ServerReadyResponse* response) {
  response->set_ready(api_.ServerReady());
  return grpc::Status::OK;
}

grpc::Status InferenceService::ModelReady(grpc::ServerContext*,
                                          const inference::ModelReadyRequest* request,
                                          inference::ModelReadyResponse* response) {
  response->set_ready(api_.ModelReady(request->name(), request->version()));
  return grpc::Status::OK;
}

grpc::Status InferenceService::ServerMetadata(grpc::ServerContext*,
                                              const inference::ServerMetadataRequest*,
                                              inference::ServerMetadataResponse* response) {
  api_.ServerMetadata(response);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ModelMetadata(grpc::ServerContext*,
                                             const inference::ModelMetadataRequest* request,
                                             inference::ModelMetadataResponse* response) {
  return ToGrpcStatus(api_.ModelMetadata(*request, response));
}

grpc::Status InferenceService::ModelConfig(grpc::ServerContext*,
                                           const inference::ModelConfigRequest* request,
                                           inference::ModelConfigResponse* response) {
  return ToGrpcStatus(api_.ModelConfig(*request, response));
}

grpc::Status InferenceService::ModelStatistics(
    grpc::ServerContext*, const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  return ToGrpcStatus(api_.ModelStatistics(*request, response));
}

grpc::Status InferenceService::RepositoryIndex(grpc::ServerContext*,
                                               const inference::RepositoryIndexRequest* request,
                                               inference::RepositoryIndexResponse* response) {
  api_.RepositoryIndex(*request, response);
  return grpc::Status::OK;
}

grpc::Status InferenceService::RepositoryModelLoad(
    grpc::ServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  return ToGrpcStatus(api_.LoadModel(request->model_name()));
}

grpc::Status InferenceService::RepositoryModelUnload(
    grpc::ServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  return ToGrpcStatus(api_.UnloadModel(request->model_name()));
}

grpc::Status InferenceService::TraceSetting(grpc::ServerContext* context,
                                            const inference::TraceSettingRequest* request,
                                            inference::TraceSettingResponse* response) {
  RequestTracer::Changes changes;
  for (const auto& [name, value] : request->settings()) {
    changes[name] = value.value().empty()
                        ? std::nullopt
                        : std::optional<std::vector<std::string>>(
                              std::vector<std::string>(value.value().begin(), value.value().end()));
  }
  if (!changes.empty()) {
    if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  }
  absl::StatusOr<RequestTracer::Settings> settings =
      api_.TraceSetting(request->model_name(), changes);
  if (!settings.ok()) return ToGrpcStatus(settings.status());
  for (const auto& [name, values] : *settings) {
    auto& out = (*response->mutable_settings())[name];
    for (const std::string& v : values) out.add_value(v);
  }
  return grpc::Status::OK;
}

}  // namespace precompile::server
