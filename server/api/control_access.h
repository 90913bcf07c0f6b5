// Who may call what besides inference: the admin token, and the rule that
// control (loading, unloading, rescanning models) is off until an operator
// turns it on.
//
// Calls that change what is served (the admin service's LoadModel,
// UnloadModel and Rescan; KServe's RepositoryModelLoad and Unload) need:
//   - with a token: the metadata (over HTTP, the header)
//     "authorization: Bearer <token>";
//   - without one: --allow_unauthenticated_control, meant for development;
//     otherwise PERMISSION_DENIED naming both ways to enable them.
// The admin service's reading calls (models, summary, FRAMES, coverage,
// warnings) need the token when there is one, and nothing otherwise.
//
// Thread safety: immutable after construction; checks may run concurrently.
#ifndef PRECOMPILE_SERVER_API_CONTROL_ACCESS_H_
#define PRECOMPILE_SERVER_API_CONTROL_ACCESS_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace precompile::server {

// The longest token a token file may hold.
inline constexpr size_t kMaxAdminTokenBytes = 4096;

class ControlAccess {
 public:
  // `token`: empty for none. `allow_unauthenticated`: control calls need no
  // token when there is none.
  ControlAccess(std::string token, bool allow_unauthenticated)
      : token_(std::move(token)), allow_unauthenticated_(allow_unauthenticated) {}

  // For the admin service's reading calls: OK, or UNAUTHENTICATED when a
  // token is set and the call does not carry it.
  grpc::Status CheckRead(const grpc::ServerContext& context) const;

  // For calls that change what is served: OK, UNAUTHENTICATED (a token is set
  // and the call does not carry it) or PERMISSION_DENIED (no token, and
  // unauthenticated control is not allowed).
  grpc::Status CheckControl(const grpc::ServerContext& context) const;
  // The same for an HTTP request: `authorization` is its Authorization
  // header's value, or null without one.
  absl::Status CheckControlHeader(const char* authorization) const;

 private:
  const std::string token_;
  const bool allow_unauthenticated_;
};

// Reads the admin token from `path`, without the surrounding whitespace (a
// file usually ends with a newline). INVALID_ARGUMENT, naming the file and
// the reason, when it is missing or unreadable, readable by every user, not
// a regular file, longer than kMaxAdminTokenBytes, or empty. The token
// itself never appears in an error.
absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path);

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_API_CONTROL_ACCESS_H_
