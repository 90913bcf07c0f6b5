#include "client/admin_client.h"

#include <utility>

#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace precompile::client {

using precompile::v1::ModelRequest;

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Create(
    const ClientOptions& options, std::shared_ptr<grpc::Channel> channel) {
  ASSIGN_OR_RETURN(std::unique_ptr<PerAttemptCount<Stubs>> stubs,
                   StubsPerAttemptCount(options, std::move(channel), &AdminClient::StubsOn));
  return std::unique_ptr<AdminClient>(new AdminClient(options, std::move(stubs)));
}

AdminClient::Stubs AdminClient::StubsOn(std::shared_ptr<grpc::Channel> channel) {
  Stubs stubs;
  stubs.admin = precompile::v1::PrecompileAdmin::NewStub(channel);
  stubs.channel = std::move(channel);
  return stubs;
}

AdminClient::AdminClient(const ClientOptions& options,
                         std::unique_ptr<PerAttemptCount<Stubs>> stubs)
    : options_(options), stubs_(std::move(stubs)) {}

namespace {

ModelRequest Named(const std::string& model) {
  ModelRequest request;
  request.set_name(model);
  return request;
}

}  // namespace

template <typename Request, typename Response>
absl::StatusOr<Response> AdminClient::Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                                           const Request& request, bool retried,
                                           const CallOptions& call) {
  const int attempts = retried ? call.max_attempts.value_or(options_.retry.max_attempts) : 1;
  absl::StatusOr<const Stubs*> stubs = retried ? stubs_->Get(attempts) : &stubs_->own();
  if (!stubs.ok()) return stubs.status();
  grpc::ClientContext context;
  const absl::Duration timeout = call.timeout.value_or(options_.timeout);
  if (timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  if (!options_.admin_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.admin_token);
  }
  Response response;
  absl::Status status =
      RetriedResult(((*stubs)->admin.get()->*method)(&context, request, &response), attempts);
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

absl::StatusOr<precompile::v1::MissesResponse> AdminClient::Misses(const std::string& model,
                                                                  int64_t version,
                                                                  const CallOptions& call) {
  precompile::v1::MissesRequest request;
  request.set_name(model);
  request.set_version(version);
  return Call(&Stub::Misses, request, true, call);
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
