// The one place where absl::Status becomes grpc::Status. The two share their
// code numbers (both follow google.rpc.Code), so the code carries over and
// the message is kept whole.
#ifndef PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_
#define PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace precompile::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_
