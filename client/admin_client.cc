#include "client/admin_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "client/retry.h"

namespace precompile::client {

using precompile::v1::ModelRequest;
using Stub = precompile::v1::PrecompileAdmin::Stub;

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Create(
    const ClientOptions& options, std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> created = CreateChannel(options);
    if (!created.ok()) return created.status();
    channel = *std::move(created);
  }
  return std::unique_ptr<AdminClient>(new AdminClient(options, std::move(channel)));
}

AdminClient::AdminClient(const ClientOptions& options, std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      channel_(std::move(channel)),
      admin_(precompile::v1::PrecompileAdmin::NewStub(channel_)) {}

absl::Status AdminClient::Run(const CallOptions& call, bool retryable,
                              const std::function<grpc::Status(grpc::ClientContext&)>& rpc) {
  const absl::Duration timeout = call.timeout.value_or(options_.timeout);
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  const int attempts = retryable ? call.max_attempts.value_or(options_.retry.max_attempts) : 1;
  return CallWithRetries(
      options_.retry, attempts, deadline,
      [&](grpc::ClientContext& context) {
        if (deadline != absl::InfiniteFuture()) {
          context.set_deadline(absl::ToChronoTime(deadline));
        }
        if (!options_.admin_token.empty()) {
          context.AddMetadata("authorization", "Bearer " + options_.admin_token);
        }
      },
      rpc);
}

namespace {

ModelRequest Named(const std::string& model) {
  ModelRequest request;
  request.set_name(model);
  return request;
}

}  // namespace

template <typename Request, typename Response>
absl::StatusOr<Response> AdminClient::Call(
    grpc::Status (precompile::v1::PrecompileAdmin::Stub::*method)(grpc::ClientContext*,
                                                                  const Request&, Response*),
    const Request& request, bool retryable, const CallOptions& call) {
  Response response;
  absl::Status status = Run(call, retryable, [&](grpc::ClientContext& context) {
    response.Clear();  // a retry must not see a failed attempt's partial result
    return (admin_.get()->*method)(&context, request, &response);
  });
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<precompile::v1::ListModelsResponse> AdminClient::ListModels(
    const CallOptions& call) {
  return Call(&Stub::ListModels, precompile::v1::ListModelsRequest(), true, call);
}

absl::StatusOr<precompile::v1::SummaryResponse> AdminClient::GetSummary(const std::string& model,
                                                                        const CallOptions& call) {
  return Call(&Stub::GetSummary, Named(model), true, call);
}

absl::StatusOr<precompile::v1::FramesResponse> AdminClient::GetFrames(const std::string& model,
                                                                      const CallOptions& call) {
  return Call(&Stub::GetFrames, Named(model), true, call);
}

absl::StatusOr<precompile::v1::CoverageResponse> AdminClient::GetCoverage(const std::string& model,
                                                                          const CallOptions& call) {
  return Call(&Stub::GetCoverage, Named(model), true, call);
}

absl::StatusOr<precompile::v1::WarningsResponse> AdminClient::ListWarnings(
    const std::string& model, const CallOptions& call) {
  return Call(&Stub::ListWarnings, Named(model), true, call);
}

absl::StatusOr<precompile::v1::LoadModelResponse> AdminClient::LoadModel(const std::string& model,
                                                                         const CallOptions& call) {
  return Call(&Stub::LoadModel, Named(model), false, call);
}

absl::StatusOr<precompile::v1::UnloadModelResponse> AdminClient::UnloadModel(
    const std::string& model, const CallOptions& call) {
  return Call(&Stub::UnloadModel, Named(model), false, call);
}

absl::StatusOr<precompile::v1::RescanResponse> AdminClient::Rescan(const CallOptions& call) {
  return Call(&Stub::Rescan, precompile::v1::RescanRequest(), false, call);
}

}  // namespace precompile::client
