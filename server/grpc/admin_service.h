// precompile.v1.PrecompileAdmin: a model's precompile summary, its FRAMES
// list, per-frame coverage, the eager-fallback warnings issued, and control
// of the repository.
//
// Served through a UnaryCallRouter (server/grpc/unary_call_router.h).
//
// Thread safety: the router calls the methods concurrently; the service
// holds no state of its own.
#ifndef PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_
#define PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>
#include <utility>

#include "proto/admin.pb.h"
#include "server/api/control_access.h"
#include "server/grpc/unary_call_router.h"
#include "server/repository/model_repository.h"

namespace precompile::server {

class AdminService final {
 public:
  // `access` decides who may read (the listing, summaries, FRAMES, coverage,
  // warnings) and who may control (load, unload, rescan).
  AdminService(ModelRepository& repository, ControlAccess access)
      : repository_(repository), access_(std::move(access)) {}

  // Routes every method of precompile.v1.PrecompileAdmin to this service.
  void RouteUnaryCalls(UnaryCallRouter& router);
  // precompile.v1.PrecompileAdmin.
  static const google::protobuf::ServiceDescriptor& Described();

  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse*);
  grpc::Status GetSummary(grpc::ServerContext*, const v1::ModelRequest*, v1::SummaryResponse*);
  grpc::Status GetFrames(grpc::ServerContext*, const v1::ModelRequest*, v1::FramesResponse*);
  grpc::Status GetCoverage(grpc::ServerContext*, const v1::ModelRequest*, v1::CoverageResponse*);
  grpc::Status ListWarnings(grpc::ServerContext*, const v1::ModelRequest*, v1::WarningsResponse*);
  grpc::Status Misses(grpc::ServerContext*, const v1::MissesRequest*, v1::MissesResponse*);
  grpc::Status LoadModel(grpc::ServerContext*, const v1::ModelRequest*, v1::LoadModelResponse*);
  grpc::Status UnloadModel(grpc::ServerContext*, const v1::ModelRequest*, v1::UnloadModelResponse*);
  grpc::Status Rescan(grpc::ServerContext*, const v1::RescanRequest*, v1::RescanResponse*);

 private:
  ModelRepository& repository_;
  const ControlAccess access_;
};

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_ADMIN_SERVICE_H_
