// Listening TCP sockets for the server's own transports (HTTP/REST and the
// gRPC front), and the descriptors their connections may take.
#ifndef PRECOMPILE_BASE_LISTEN_SOCKET_H_
#define PRECOMPILE_BASE_LISTEN_SOCKET_H_

#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace precompile {

// A non-blocking listening socket on `address` (host:port, or [host]:port
// for IPv6; port 0 picks a free one) and the port it has. `what` names the
// transport in errors ("HTTP").
absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address, const char* what);

// How many connections of `descriptors_each` descriptors the process's
// limit leaves room for, beside a reserve for everything else (models,
// logs), raising the soft limit toward the hard one when `wanted` needs it.
int ConnectionsWithinDescriptorLimit(int wanted, int descriptors_each);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_LISTEN_SOCKET_H_
