#include "client/inference_client.h"

#include <grpcpp/alarm.h>

#include <optional>
#include <utility>

#include "absl/time/clock.h"
#include "client/retry.h"

namespace precompile::client {

// One asynchronous Infer across its attempts. Owned by the client from
// InferAsync until its callback has run. `stage` is guarded by the client's
// mutex; the rest belongs to whichever thread handles the call's current
// completion-queue event.
class InferenceClient::AsyncCall {
 public:
  enum class Stage { kRpc, kBackoff };

  AsyncCall(std::shared_ptr<const inference::ModelInferRequest> request, InferCallback done,
            const RetryPolicy& policy, int max_attempts, absl::Time deadline)
      : request(std::move(request)),
        done(std::move(done)),
        deadline(deadline),
        retry(policy, max_attempts, deadline) {}

  const std::shared_ptr<const inference::ModelInferRequest> request;
  InferCallback done;
  const absl::Time deadline;
  RetryState retry;
  Stage stage = Stage::kRpc;
  // Declared before `reader`: the reader lives in the call's arena, which
  // the context frees, so the reader must go first.
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> reader;
  inference::ModelInferResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::Alarm> alarm;
};

absl::StatusOr<std::unique_ptr<InferenceClient>> InferenceClient::Create(
    const ClientOptions& options, std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> created = CreateChannel(options);
    if (!created.ok()) return created.status();
    channel = *std::move(created);
  }
  return std::unique_ptr<InferenceClient>(new InferenceClient(options, std::move(channel)));
}

InferenceClient::InferenceClient(const ClientOptions& options,
                                 std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      channel_(std::move(channel)),
      inference_(inference::GRPCInferenceService::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {
  const int threads = std::max(1, options_.async_threads);
  for (int i = 0; i < threads; ++i) pollers_.emplace_back([this] { PollCompletions(); });
}

InferenceClient::~InferenceClient() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (AsyncCall* call : outstanding_) {
      if (call->stage == AsyncCall::Stage::kRpc) {
        if (call->context) call->context->TryCancel();
      } else if (call->alarm) {
        call->alarm->Cancel();
      }
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

absl::Status InferenceClient::Run(const CallOptions& call, bool retryable, bool admin,
                                  const std::function<grpc::Status(grpc::ClientContext&)>& rpc) {
  const absl::Time deadline = DeadlineOf(call);
  return CallWithRetries(
      options_.retry, retryable ? AttemptsOf(call) : 1, deadline,
      [&](grpc::ClientContext& context) { Prepare(context, deadline, admin); }, rpc);
}

absl::StatusOr<bool> InferenceClient::ServerLive(const CallOptions& call) {
  inference::ServerLiveResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    return inference_->ServerLive(&context, {}, &response);
  });
  if (!status.ok()) return status;
  return response.live();
}

absl::StatusOr<bool> InferenceClient::ServerReady(const CallOptions& call) {
  inference::ServerReadyResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    return inference_->ServerReady(&context, {}, &response);
  });
  if (!status.ok()) return status;
  return response.ready();
}

absl::StatusOr<bool> InferenceClient::ModelReady(const std::string& model,
                                                 const std::string& version,
                                                 const CallOptions& call) {
  inference::ModelReadyRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelReadyResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    return inference_->ModelReady(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response.ready();
}

absl::StatusOr<inference::ServerMetadataResponse> InferenceClient::ServerMetadata(
    const CallOptions& call) {
  inference::ServerMetadataResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->ServerMetadata(&context, {}, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<inference::ModelMetadataResponse> InferenceClient::ModelMetadata(
    const std::string& model, const std::string& version, const CallOptions& call) {
  inference::ModelMetadataRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelMetadataResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->ModelMetadata(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<inference::ModelConfigResponse> InferenceClient::ModelConfig(
    const std::string& model, const std::string& version, const CallOptions& call) {
  inference::ModelConfigRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelConfigResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->ModelConfig(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<inference::ModelStatisticsResponse> InferenceClient::ModelStatistics(
    const std::string& model, const std::string& version, const CallOptions& call) {
  inference::ModelStatisticsRequest request;
  request.set_name(model);
  request.set_version(version);
  inference::ModelStatisticsResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->ModelStatistics(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<inference::RepositoryIndexResponse> InferenceClient::RepositoryIndex(
    bool ready_only, const CallOptions& call) {
  inference::RepositoryIndexRequest request;
  request.set_ready(ready_only);
  inference::RepositoryIndexResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->RepositoryIndex(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::Status InferenceClient::RepositoryModelLoad(const std::string& model,
                                                  const CallOptions& call) {
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  inference::RepositoryModelLoadResponse response;
  return Run(call, false, true, [&](grpc::ClientContext& context) {
    return inference_->RepositoryModelLoad(&context, request, &response);
  });
}

absl::Status InferenceClient::RepositoryModelUnload(const std::string& model,
                                                    const CallOptions& call) {
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(model);
  inference::RepositoryModelUnloadResponse response;
  return Run(call, false, true, [&](grpc::ClientContext& context) {
    return inference_->RepositoryModelUnload(&context, request, &response);
  });
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> InferenceClient::Health(
    const std::string& service, const CallOptions& call) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    return health_->Check(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response.status();
}

absl::StatusOr<inference::ModelInferResponse> InferenceClient::Infer(
    const inference::ModelInferRequest& request, const CallOptions& call) {
  inference::ModelInferResponse response;
  absl::Status status = Run(call, true, false, [&](grpc::ClientContext& context) {
    response.Clear();
    return inference_->ModelInfer(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

void InferenceClient::InferAsync(std::shared_ptr<const inference::ModelInferRequest> request,
                                 const CallOptions& call, InferCallback done) {
  auto* async = new AsyncCall(std::move(request), std::move(done), options_.retry, AttemptsOf(call),
                              DeadlineOf(call));
  {
    std::lock_guard<std::mutex> lock(mu_);
    outstanding_.insert(async);
  }
  StartAttempt(async);
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

void InferenceClient::StartAttempt(AsyncCall* call) {
  auto context = std::make_unique<grpc::ClientContext>();
  Prepare(*context, call->deadline, /*admin=*/false);
  // Serializes the request: outside the lock, which concurrent calls share.
  // Declared after `context`, so destroyed first if never started.
  auto reader =
      inference_->PrepareAsyncModelInfer(context.get(), *call->request, &completion_queue_);
  {
    // Started under the lock that the poller takes before it touches the
    // call: gRPC hands the call over through code ThreadSanitizer cannot
    // see, and the lock makes the hand-over visible to it.
    std::lock_guard<std::mutex> lock(mu_);
    if (!shutting_down_) {
      call->stage = AsyncCall::Stage::kRpc;
      call->reader.reset();  // before the context that owns its memory
      call->context = std::move(context);
      call->reader = std::move(reader);
      call->response.Clear();
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
    AsyncCall::Stage stage;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stage = call->stage;
    }
    if (stage == AsyncCall::Stage::kBackoff) {
      // The alarm fired (ok), or was cancelled because the client is going.
      if (ok) {
        StartAttempt(call);
      } else {
        Finish(call, absl::CancelledError("the client is shutting down"));
      }
      continue;
    }
    std::optional<absl::Duration> delay = call->retry.OnAttemptDone(call->status);
    if (!delay) {
      absl::Status status = call->retry.Result(call->status);
      if (status.ok()) {
        Finish(call, std::move(call->response));
      } else {
        Finish(call, std::move(status));
      }
      continue;
    }
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_) {
        cancelled = true;
      } else {
        call->stage = AsyncCall::Stage::kBackoff;
        call->alarm = std::make_unique<grpc::Alarm>();
        call->alarm->Set(&completion_queue_, absl::ToChronoTime(absl::Now() + *delay), call);
      }
    }
    if (cancelled) Finish(call, absl::CancelledError("the client is shutting down"));
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
