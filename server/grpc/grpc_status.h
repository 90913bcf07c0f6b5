// The one place where absl::Status becomes grpc::Status. The two share their
// code numbers (both follow google.rpc.Code), so the code carries over, and
// the message does as a client gets one (ClientMessage: at most 4 KiB).
#ifndef PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_
#define PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "base/log_text.h"

namespace precompile::server {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      ClientMessage(status.message()));
}

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_GRPC_GRPC_STATUS_H_
