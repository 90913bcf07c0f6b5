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

// Descriptors promised to one transport's connections out of the process's
// limit (ulimit -n). The shares of all transports are counted together, so
// that every transport full at once still leaves a reserve for everything
// else (models, logs, gRPC's own): counted one by one, the HTTP port and the
// gRPC front would each fit, and together run the process out of
// descriptors. A share is given back when it is destroyed.
//
// Thread safety: Reserve and the destructor from any thread.
class DescriptorShare {
 public:
  DescriptorShare() = default;
  // Room for up to `wanted` connections of `descriptors_each` descriptors
  // beside the other shares and the reserve, raising the soft limit toward
  // the hard one as far as they need; at least 16 connections however
  // little is left.
  static DescriptorShare Reserve(int wanted, int descriptors_each);
  DescriptorShare(DescriptorShare&& other) noexcept;
  DescriptorShare& operator=(DescriptorShare&& other) noexcept;
  ~DescriptorShare();

  int connections() const { return connections_; }

 private:
  int connections_ = 0;
  long long descriptors_ = 0;
};

}  // namespace precompile

#endif  // PRECOMPILE_BASE_LISTEN_SOCKET_H_
