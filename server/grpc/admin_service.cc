#include "server/grpc/admin_service.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/grpc/grpc_status.h"

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

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

const google::protobuf::ServiceDescriptor& AdminService::Described() {
  return *v1::ListModelsRequest::descriptor()->file()->FindServiceByName("PrecompileAdmin");
}

void AdminService::RouteUnaryCalls(UnaryCallRouter& router) {
  const google::protobuf::ServiceDescriptor& service = Described();
  router.Add(service, "ListModels", this, &AdminService::ListModels);
  router.Add(service, "GetSummary", this, &AdminService::GetSummary);
  router.Add(service, "GetFrames", this, &AdminService::GetFrames);
  router.Add(service, "GetCoverage", this, &AdminService::GetCoverage);
  router.Add(service, "ListWarnings", this, &AdminService::ListWarnings);
  router.Add(service, "Misses", this, &AdminService::Misses);
  // The repository loads and unloads one model at a time; a call without
  // the right to is refused before it waits.
  using Lane = UnaryCallRouter::Lane;
  auto may_control = [this](const grpc::ServerContext& context) {
    return access_.CheckControl(context);
  };
  router.Add(service, "LoadModel", this, &AdminService::LoadModel, Lane::kOneAtATime,
             may_control);
  router.Add(service, "UnloadModel", this, &AdminService::UnloadModel, Lane::kOneAtATime,
             may_control);
  router.Add(service, "Rescan", this, &AdminService::Rescan, Lane::kOneAtATime, may_control);
}

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
    out->set_time(UnixSeconds(w.time));
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::Misses(grpc::ServerContext* context, const v1::MissesRequest* request,
                                  v1::MissesResponse* response) {
  if (grpc::Status s = access_.CheckRead(*context); !s.ok()) return s;
  if (request->version() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("version ", request->version(),
                                     " is not a version: give one >= 1, or 0 for the newest"));
  }
  auto handle = repository_.Get(
      request->name(), request->version() == 0 ? "" : absl::StrCat(request->version()));
  if (!handle.ok()) return ToGrpcStatus(handle.status());
  const LoadedVersion& model = *handle->model;
  const auto& m = model.manifest();
  response->set_name(request->name());
  response->set_version(handle->version);
  response->set_model_name(m.model_name());
  response->set_torch_version(m.torch_version());
  response->set_device(m.device());
  response->set_signatures_per_frame(static_cast<uint32_t>(model.miss_signatures_per_frame()));
  for (FrameMisses& misses : model.Misses()) {
    const auto& frame = m.frames(misses.frame_index);
    auto* f = response->add_frames();
    f->set_frame(frame.name());
    f->set_eager_fallback(frame.eager_fallback());
    f->set_is_entry(frame.name() == m.entry_frame());
    f->set_other_calls(misses.other_calls);
    for (MissRecord& r : misses.signatures) {
      auto* out = f->add_signatures();
      *out->mutable_call() = std::move(r.call);
      out->set_count(r.count);
      out->set_first_seen(UnixSeconds(r.first_seen));
      out->set_last_seen(UnixSeconds(r.last_seen));
      out->set_outcome(r.outcome == Outcome::kEagerFallback ? v1::EAGER_FALLBACK : v1::REFUSED);
      out->set_closest_variant(std::move(r.explanation.closest_variant));
      out->set_failing_guard(std::move(r.explanation.failing_guard));
    }
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
