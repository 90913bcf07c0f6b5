#include "client/inference_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace precompile::client {

// One asynchronous Infer, gRPC's retries included. Owned by the client from
// InferAsync until its callback has run; the completion-queue thread that
// gets its event has it to itself.
class InferenceClient::AsyncCall {
 public:
  AsyncCall(std::shared_ptr<const inference::ModelInferRequest> request, InferCallback done,
            int max_attempts, absl::Time deadline)
      : request(std::move(request)),
        done(std::move(done)),
        max_attempts(max_attempts),
        deadline(deadline) {}

  const std::shared_ptr<const inference::ModelInferRequest> request;
  InferCallback done;
  const int max_attempts;
  const absl::Time deadline;
  // Declared before `reader`: the reader lives in the call's arena, which
  // the context frees, so the reader must go first.
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> reader;
  inference::ModelInferResponse response;
  grpc::Status status;
};

absl::StatusOr<std::unique_ptr<InferenceClient>> InferenceClient::Create(
    const ClientOptions& options, std::shared_ptr<grpc::Channel> channel) {
  ASSIGN_OR_RETURN(std::unique_ptr<PerAttemptCount<Stubs>> stubs,
                   StubsPerAttemptCount(options, std::move(channel), &InferenceClient::StubsOn));
  return std::unique_ptr<InferenceClient>(new InferenceClient(options, std::move(stubs)));
}

InferenceClient::Stubs InferenceClient::StubsOn(std::shared_ptr<grpc::Channel> channel) {
  Stubs stubs;
  stubs.inference = inference::GRPCInferenceService::NewStub(channel);
  stubs.health = grpc::health::v1::Health::NewStub(channel);
  stubs.channel = std::move(channel);
  return stubs;
}

InferenceClient::InferenceClient(const ClientOptions& options,
                                 std::unique_ptr<PerAttemptCount<Stubs>> stubs)
    : options_(options), stubs_(std::move(stubs)) {
  const int threads = std::max(1, options_.async_threads);
  for (int i = 0; i < threads; ++i) pollers_.emplace_back([this] { PollCompletions(); });
}

InferenceClient::~InferenceClient() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (AsyncCall* call : outstanding_) {
      if (call->context) call->context->TryCancel();
    }
    drained_.wait(lock, [this] { return outstanding_.empty(); });
  }
  completion_queue_.Shutdown();
  for (std::thread& poller : pollers_) poller.join();
}

absl::Time InferenceClient::DeadlineOf(const CallOptions& call) const {
  const absl::Duration timeout = call.timeout.value_or(options_.timeout);
  if (timeout == absl::InfiniteDuration()) return absl::InfiniteFuture();
  return absl::Now() + timeout;
}

int InferenceClient::AttemptsOf(const CallOptions& call) const {
  return call.max_attempts.value_or(options_.retry.max_attempts);
}

void InferenceClient::Prepare(grpc::ClientContext& context, absl::Time deadline, bool admin) const {
  if (deadline != absl::InfiniteFuture()) context.set_deadline(absl::ToChronoTime(deadline));
  if (admin && !options_.admin_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.admin_token);
  }
}

absl::Status InferenceClient::Run(
    const CallOptions& call, bool retried, bool admin,
    const std::function<grpc::Status(const Stubs&, grpc::ClientContext&)>& rpc) {
  const int attempts = retried ? AttemptsOf(call) : 1;
  absl::StatusOr<const Stubs*> stubs = retried ? stubs_->Get(attempts) : &stubs_->own();
  if (!stubs.ok()) return stubs.status();
  grpc::ClientContext context;
  Prepare(context, DeadlineOf(call), admin);
  return RetriedResult(rpc(**stubs, context), attempts);
}

template <typename Request, typename Response>
absl::StatusOr<Response> InferenceClient::Ask(
    const CallOptions& call, const Request& request,
    grpc::Status (inference::GRPCInferenceService::Stub::*method)(grpc::ClientContext*,
                                                                  const Request&, Response*)) {
  Response response;
  absl::Status status =
      Run(call, true, false, [&](const Stubs& stubs, grpc::ClientContext& context) {
        return (stubs.inference.get()->*method)(&context, request, &response);
      });
  if (!status.ok()) return status;
  return response;
}

namespace {

// A request about one model (and version: empty for the newest).
template <typename Request>
Request AboutModel(const std::string& model, const std::string& version) {
  Request request;
  request.set_name(model);
  request.set_version(version);
  return request;
}

using Stub = inference::GRPCInferenceService::Stub;

}  // namespace

absl::StatusOr<bool> InferenceClient::ServerLive(const CallOptions& call) {
  ASSIGN_OR_RETURN(inference::ServerLiveResponse response,
                   Ask(call, inference::ServerLiveRequest(), &Stub::ServerLive));
  return response.live();
}

absl::StatusOr<bool> InferenceClient::ServerReady(const CallOptions& call) {
  ASSIGN_OR_RETURN(inference::ServerReadyResponse response,
                   Ask(call, inference::ServerReadyRequest(), &Stub::ServerReady));
  return response.ready();
}

absl::StatusOr<bool> InferenceClient::ModelReady(const std::string& model,
                                                 const std::string& version,
                                                 const CallOptions& call) {
  ASSIGN_OR_RETURN(inference::ModelReadyResponse response,
                   Ask(call, AboutModel<inference::ModelReadyRequest>(model, version),
                       &Stub::ModelReady));
  return response.ready();
}

absl::StatusOr<inference::ServerMetadataResponse> InferenceClient::ServerMetadata(
    const CallOptions& call) {
  return Ask(call, inference::ServerMetadataRequest(), &Stub::ServerMetadata);
}

absl::StatusOr<inference::ModelMetadataResponse> InferenceClient::ModelMetadata(
    const std::string& model, const std::string& version, const CallOptions& call) {
  return Ask(call, AboutModel<inference::ModelMetadataRequest>(model, version),
             &Stub::ModelMetadata);
}

absl::StatusOr<inference::ModelConfigResponse> InferenceClient::ModelConfig(
    const std::string& model, const std::string& version, const CallOptions& call) {
  return Ask(call, AboutModel<inference::ModelConfigRequest>(model, version), &Stub::ModelConfig);
}

absl::StatusOr<inference::ModelStatisticsResponse> InferenceClient::ModelStatistics(
    const std::string& model, const std::string& version, const CallOptions& call) {
  return Ask(call, AboutModel<inference::ModelStatisticsRequest>(model, version),
             &Stub::ModelStatistics);
}

absl::StatusOr<inference::RepositoryIndexResponse> InferenceClient::RepositoryIndex(
    bool ready_only, const CallOptions& call) {
  inference::RepositoryIndexRequest request;
  request.set_ready(ready_only);
  return Ask(call, request, &Stub::RepositoryIndex);
}

absl::Status InferenceClient::RepositoryModelLoad(const std::string& model,
                                                  const CallOptions& call) {
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  inference::RepositoryModelLoadResponse response;
  return Run(call, false, true, [&](const Stubs& stubs, grpc::ClientContext& context) {
    return stubs.inference->RepositoryModelLoad(&context, request, &response);
  });
}

absl::Status InferenceClient::RepositoryModelUnload(const std::string& model,
                                                    const CallOptions& call) {
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(model);
  inference::RepositoryModelUnloadResponse response;
  return Run(call, false, true, [&](const Stubs& stubs, grpc::ClientContext& context) {
    return stubs.inference->RepositoryModelUnload(&context, request, &response);
  });
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> InferenceClient::Health(
    const std::string& service, const CallOptions& call) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status =
      Run(call, true, false, [&](const Stubs& stubs, grpc::ClientContext& context) {
        return stubs.health->Check(&context, request, &response);
      });
  if (!status.ok()) return status;
  return response.status();
}

absl::StatusOr<inference::ModelInferResponse> InferenceClient::Infer(
    const inference::ModelInferRequest& request, const CallOptions& call) {
  return Ask(call, request, &Stub::ModelInfer);
}

void InferenceClient::InferAsync(std::shared_ptr<const inference::ModelInferRequest> request,
                                 const CallOptions& call, InferCallback done) {
  const int attempts = AttemptsOf(call);
  auto* async = new AsyncCall(std::move(request), std::move(done), attempts, DeadlineOf(call));
  {
    std::lock_guard<std::mutex> lock(mu_);
    outstanding_.insert(async);
  }
  absl::StatusOr<const Stubs*> stubs = stubs_->Get(attempts);
  if (!stubs.ok()) {
    Finish(async, stubs.status());
    return;
  }
  Start(async, **stubs);
}

std::future<absl::StatusOr<inference::ModelInferResponse>> InferenceClient::InferFuture(
    inference::ModelInferRequest request, const CallOptions& call) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<inference::ModelInferResponse>>>();
  auto future = promise->get_future();
  InferAsync(std::make_shared<const inference::ModelInferRequest>(std::move(request)), call,
             [promise](absl::StatusOr<inference::ModelInferResponse> result) {
               promise->set_value(std::move(result));
             });
  return future;
}

void InferenceClient::Start(AsyncCall* call, const Stubs& stubs) {
  auto context = std::make_unique<grpc::ClientContext>();
  Prepare(*context, call->deadline, /*admin=*/false);
  // Serializes the request: outside the lock, which concurrent calls share.
  // Declared after `context`, so destroyed first if never started.
  auto reader =
      stubs.inference->PrepareAsyncModelInfer(context.get(), *call->request, &completion_queue_);
  {
    // Started under the lock that the poller takes before it touches the
    // call: gRPC hands the call over through code ThreadSanitizer cannot
    // see, and the lock makes the hand-over visible to it.
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutting_down_) {
      call->context = std::move(context);
      call->reader = std::move(reader);
      call->reader->StartCall();
      call->reader->Finish(&call->response, &call->status, call);
      return;
    }
  }
  Finish(call, absl::CancelledError("the client is shutting down"));
}

void InferenceClient::PollCompletions() {
  void* tag;
  bool ok;
  while (completion_queue_.Next(&tag, &ok)) {
    auto* call = static_cast<AsyncCall*>(tag);
    {
      // Pairs with the lock in Start (see there).
      std::lock_guard<std::mutex> lock(mu_);
    }
    absl::Status status = RetriedResult(call->status, call->max_attempts);
    if (status.ok()) {
      Finish(call, std::move(call->response));
    } else {
      Finish(call, std::move(status));
    }
  }
}

void InferenceClient::Finish(AsyncCall* call,
                             absl::StatusOr<inference::ModelInferResponse> result) {
  call->done(std::move(result));
  {
    std::lock_guard<std::mutex> lock(mu_);
    outstanding_.erase(call);
    if (outstanding_.empty()) drained_.notify_all();
  }
  delete call;
}

}  // namespace precompile::client
