// A client of precompile-serve's KServe v2 inference service (with the
// Triton extensions it serves) and of grpc.health.v1, over one channel.
//
// Every call has a deadline (ClientOptions::timeout, or CallOptions) that
// covers its retries. Calls that change nothing on the server are retried on
// UNAVAILABLE under the RetryPolicy, by gRPC (retry.h);
// RepositoryModelLoad/Unload are not.
// Errors are the server's gRPC status as an absl::Status (same code, same
// message), e.g. FAILED_PRECONDITION when no captured variant matches a call
// and the frame is not flagged for eager fallback.
//
// Asynchronous inference runs on a completion queue served by
// ClientOptions::async_threads threads owned by the client; callbacks run on
// those threads and must not block.
//
// Thread safety: all methods may be called concurrently. Destroying the
// client cancels the asynchronous calls still running and waits for their
// callbacks (which receive CANCELLED); do not start calls while it is being
// destroyed.
#ifndef PRECOMPILE_CLIENT_INFERENCE_CLIENT_H_
#define PRECOMPILE_CLIENT_INFERENCE_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "client/client_options.h"
#include "client/retry.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"

namespace precompile::client {

class InferenceClient {
 public:
  using InferCallback = std::function<void(absl::StatusOr<inference::ModelInferResponse>)>;

  // A client on a new channel to `options.address`; or on `channel` when
  // given, so that several clients share one connection: then `channel`
  // must come from CreateChannel(options), whose retry policy it carries.
  // Errors are CreateChannel's. Connecting happens on the first call.
  static absl::StatusOr<std::unique_ptr<InferenceClient>> Create(
      const ClientOptions& options, std::shared_ptr<grpc::Channel> channel = nullptr);
  ~InferenceClient();

  InferenceClient(const InferenceClient&) = delete;
  InferenceClient& operator=(const InferenceClient&) = delete;

  // KServe v2 health and metadata.
  absl::StatusOr<bool> ServerLive(const CallOptions& call = {});
  absl::StatusOr<bool> ServerReady(const CallOptions& call = {});
  absl::StatusOr<bool> ModelReady(const std::string& model, const std::string& version = "",
                                  const CallOptions& call = {});
  absl::StatusOr<inference::ServerMetadataResponse> ServerMetadata(const CallOptions& call = {});
  absl::StatusOr<inference::ModelMetadataResponse> ModelMetadata(const std::string& model,
                                                                 const std::string& version = "",
                                                                 const CallOptions& call = {});

  // Triton extensions.
  absl::StatusOr<inference::ModelConfigResponse> ModelConfig(const std::string& model,
                                                             const std::string& version = "",
                                                             const CallOptions& call = {});
  // Every model's statistics when `model` is empty.
  absl::StatusOr<inference::ModelStatisticsResponse> ModelStatistics(
      const std::string& model = "", const std::string& version = "", const CallOptions& call = {});
  absl::StatusOr<inference::RepositoryIndexResponse> RepositoryIndex(bool ready_only = false,
                                                                     const CallOptions& call = {});
  // Repository control: sends the admin token; never retried.
  absl::Status RepositoryModelLoad(const std::string& model, const CallOptions& call = {});
  absl::Status RepositoryModelUnload(const std::string& model, const CallOptions& call = {});

  // grpc.health.v1 Check: the server's status for `service` ("" for the
  // server, a model name for that model). NOT_FOUND for an unknown service.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      const std::string& service = "", const CallOptions& call = {});

  // Runs one inference call and waits for it.
  absl::StatusOr<inference::ModelInferResponse> Infer(const inference::ModelInferRequest& request,
                                                      const CallOptions& call = {});

  // Starts one inference call and returns at once; `done` runs exactly once
  // on an async thread with the response or the error (retries included).
  // `request` is shared, not copied, so that many calls can send one
  // request; it must not change until `done` runs.
  void InferAsync(std::shared_ptr<const inference::ModelInferRequest> request,
                  const CallOptions& call, InferCallback done);

  // InferAsync with a future for the result.
  std::future<absl::StatusOr<inference::ModelInferResponse>> InferFuture(
      inference::ModelInferRequest request, const CallOptions& call = {});

  const ClientOptions& options() const { return options_; }

 private:
  class AsyncCall;
  // A channel and the stubs on it.
  struct Stubs {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<inference::GRPCInferenceService::Stub> inference;
    std::unique_ptr<grpc::health::v1::Health::Stub> health;
  };
  static Stubs StubsOn(std::shared_ptr<grpc::Channel> channel);

  InferenceClient(const ClientOptions& options, std::unique_ptr<PerAttemptCount<Stubs>> stubs);
  absl::Time DeadlineOf(const CallOptions& call) const;
  int AttemptsOf(const CallOptions& call) const;
  void Prepare(grpc::ClientContext& context, absl::Time deadline, bool admin) const;
  // Runs an RPC on the channel whose retry policy makes the call's attempts
  // (when `retried`; else on the client's own, where the method has none),
  // with the admin token when `admin`.
  absl::Status Run(const CallOptions& call, bool retried, bool admin,
                   const std::function<grpc::Status(const Stubs&, grpc::ClientContext&)>& rpc);
  // A retried inference RPC without the admin token: its response, or why not.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Ask(const CallOptions& call, const Request& request,
                               grpc::Status (inference::GRPCInferenceService::Stub::*method)(
                                   grpc::ClientContext*, const Request&, Response*));

  void Start(AsyncCall* call, const Stubs& stubs);
  void PollCompletions();
  // Takes `call` out of the outstanding set and runs its callback.
  void Finish(AsyncCall* call, absl::StatusOr<inference::ModelInferResponse> result);

  const ClientOptions options_;
  const std::unique_ptr<PerAttemptCount<Stubs>> stubs_;

  grpc::CompletionQueue completion_queue_;
  std::vector<std::thread> pollers_;
  // std::mutex, not absl::Mutex: see base/notification.h.
  std::mutex mu_;
  std::condition_variable drained_;  // outstanding_ became empty
  absl::flat_hash_set<AsyncCall*> outstanding_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_INFERENCE_CLIENT_H_
