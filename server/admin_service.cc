#include "server/admin_service.h"

#include "absl/time/time.h"
#include "server/grpc_status.h"

namespace precompile::server {
namespace {

void ToProto(const ModelState& state, v1::ModelStatus* out) {
  out->set_name(state.name);
  out->set_version(state.version);
  for (const int64_t version : state.versions) out->add_versions(version);
  out->set_reason(state.reason);
  out->set_artifact_directory(state.directory);
  switch (state.phase) {
    case ModelState::Phase::kLoading: out->set_state(v1::ModelStatus::LOADING); break;
    case ModelState::Phase::kReady: out->set_state(v1::ModelStatus::READY); break;
    case ModelState::Phase::kUnloading: out->set_state(v1::ModelStatus::UNLOADING); break;
    case ModelState::Phase::kUnavailable: out->set_state(v1::ModelStatus::UNAVAILABLE); break;
  }
}

}  // namespace

grpc::Status AdminService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest*,
                                      v1::ListModelsResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  for (const ModelState& state : repository_.List()) ToProto(state, response->add_models());
  return grpc::Status::OK;
}

grpc::Status AdminService::GetSummary(grpc::ServerContext* context, const v1::ModelRequest* request,
                                      v1::SummaryResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  auto handle = repository_.Get(request->name(), "");
  if (!handle.ok()) return ToGrpcStatus(handle.status());
  const auto& m = handle->model->manifest();
  const auto& s = m.summary();
  response->set_name(request->name());
  response->set_version(handle->version);
  response->mutable_frames()->CopyFrom(s.frames());
  response->mutable_variants_per_frame()->insert(s.variants_per_frame().begin(),
                                                 s.variants_per_frame().end());
  response->mutable_eager_fallbacks()->CopyFrom(s.eager_fallbacks());
  response->mutable_uncovered_frames()->CopyFrom(s.uncovered_frames());
  response->set_truncated(s.truncated());
  response->set_complete(s.complete());
  response->set_entry_frame(m.entry_frame());
  response->set_torch_version(m.torch_version());
  response->set_device(m.device());
  response->set_cpu_isa(m.cpu_isa());
  return grpc::Status::OK;
}

grpc::Status AdminService::GetFrames(grpc::ServerContext* context, const v1::ModelRequest* request,
                                     v1::FramesResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  auto handle = repository_.Get(request->name(), "");
  if (!handle.ok()) return ToGrpcStatus(handle.status());
  response->set_frames(handle->model->frames_text());
  return grpc::Status::OK;
}

grpc::Status AdminService::GetCoverage(grpc::ServerContext* context, const v1::ModelRequest* request,
                                       v1::CoverageResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  auto handle = repository_.Get(request->name(), "");
  if (!handle.ok()) return ToGrpcStatus(handle.status());
  response->set_name(request->name());
  response->set_version(handle->version);
  for (const FrameCoverage& c : handle->model->Coverage()) {
    auto* f = response->add_frames();
    f->set_frame(c.frame);
    f->set_eager_fallback(c.eager_fallback);
    f->set_variant_calls(c.calls_by_outcome[static_cast<int>(Outcome::kVariant)]);
    f->set_eager_fallback_calls(c.calls_by_outcome[static_cast<int>(Outcome::kEagerFallback)]);
    f->set_refused_calls(c.calls_by_outcome[static_cast<int>(Outcome::kRefused)]);
    f->set_error_calls(c.calls_by_outcome[static_cast<int>(Outcome::kError)]);
    for (const auto& [id, hits] : c.variant_hits) (*f->mutable_variant_hits())[id] = hits;
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListWarnings(grpc::ServerContext* context, const v1::ModelRequest* request,
                                        v1::WarningsResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  auto handle = repository_.Get(request->name(), "");
  if (!handle.ok()) return ToGrpcStatus(handle.status());
  for (const EagerFallbackWarning& w : handle->model->Warnings()) {
    auto* out = response->add_warnings();
    out->set_frame(w.frame);
    out->set_message(w.message);
    out->set_time(absl::ToDoubleSeconds(w.time - absl::UnixEpoch()));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::LoadModel(grpc::ServerContext* context, const v1::ModelRequest* request,
                                     v1::LoadModelResponse* response) {
  if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  auto state = repository_.Load(request->name());
  if (!state.ok()) return ToGrpcStatus(state.status());
  ToProto(*state, response->mutable_status());
  return grpc::Status::OK;
}

grpc::Status AdminService::UnloadModel(grpc::ServerContext* context, const v1::ModelRequest* request,
                                       v1::UnloadModelResponse* response) {
  if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  auto state = repository_.Unload(request->name());
  if (!state.ok()) return ToGrpcStatus(state.status());
  ToProto(*state, response->mutable_status());
  return grpc::Status::OK;
}

grpc::Status AdminService::Rescan(grpc::ServerContext* context, const v1::RescanRequest*,
                                  v1::RescanResponse* response) {
  if (grpc::Status s = access_.CheckControl(*context); !s.ok()) return s;
  for (const ModelState& state : repository_.Rescan()) ToProto(state, response->add_models());
  return grpc::Status::OK;
}

}  // namespace precompile::server
