// precompile.v1.PrecompileAdmin: a model's precompile summary, its FRAMES
// list, per-frame coverage, the eager-fallback warnings issued, and control
// of the repository.
//
// Thread safety: gRPC calls the methods concurrently; the service holds no
// state of its own.
#ifndef PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_

#include <string>
#include <utility>

#include "proto/admin.grpc.pb.h"
#include "server/api/control_access.h"
#include "server/repository/model_repository.h"

namespace precompile::server {

class AdminService final : public precompile::v1::PrecompileAdmin::Service {
 public:
  // `access` decides who may read (the listing, summaries, FRAMES, coverage,
  // warnings) and who may control (load, unload, rescan).
  AdminService(ModelRepository& repository, ControlAccess access)
      : repository_(repository), access_(std::move(access)) {}

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse*) override;
  grpc::Status GetSummary(grpc::ServerContext*, const v1::ModelRequest*,
                          v1::SummaryResponse*) override;
  grpc::Status GetFrames(grpc::ServerContext*, const v1::ModelRequest*,
                         v1::FramesResponse*) override;
  grpc::Status GetCoverage(grpc::ServerContext*, const v1::ModelRequest*,
                           v1::CoverageResponse*) override;
  grpc::Status ListWarnings(grpc::ServerContext*, const v1::ModelRequest*,
                            v1::WarningsResponse*) override;
  grpc::Status Misses(grpc::ServerContext*, const v1::MissesRequest*,
                      v1::MissesResponse*) override;
  grpc::Status LoadModel(grpc::ServerContext*, const v1::ModelRequest*,
                         v1::LoadModelResponse*) override;
  grpc::Status UnloadModel(grpc::ServerContext*, const v1::ModelRequest*,
                           v1::UnloadModelResponse*) override;
  grpc::Status Rescan(grpc::ServerContext*, const v1::RescanRequest*,
                      v1::RescanResponse*) override;

 private:
  ModelRepository& repository_;
  const ControlAccess access_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_
