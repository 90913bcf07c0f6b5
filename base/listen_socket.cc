#include "base/listen_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/base/thread_annotations.h"

namespace precompile {
namespace {

// Descriptors kept for everything but connections (models, gRPC, logs)
// when connections are held to the process's limit.
constexpr int kOtherDescriptors = 256;

// What the DescriptorShares alive have been promised, in descriptors.
// std::mutex, not absl::Mutex: see base/notification.h.
std::mutex promised_mu;
long long promised ABSL_GUARDED_BY(promised_mu) = 0;

// host:port, or [host]:port for IPv6.
absl::StatusOr<std::pair<std::string, int>> HostAndPort(const std::string& address,
                                                        const char* what) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

}  // namespace

absl::StatusOr<std::pair<int, int>> ListenTcp(const std::string& address, const char* what) {
  auto host_port = HostAndPort(address, what);
  if (!host_port.ok()) return host_port.status();
  const auto& [host, port] = *host_port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve the ", what, " address ", address));
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("cannot listen for ", what, " on ", address));
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return std::make_pair(fd, bound_port);
}

DescriptorShare DescriptorShare::Reserve(int wanted, int descriptors_each) {
  std::lock_guard<std::mutex> lock(promised_mu);
  DescriptorShare share;
  rlimit limit{};
  const long long asked = static_cast<long long>(wanted) * descriptors_each;
  const long long needed = promised + asked + kOtherDescriptors;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = limit.rlim_max = RLIM_INFINITY;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(needed)) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY
                          ? static_cast<rlim_t>(needed)
                          : std::min(static_cast<rlim_t>(needed), limit.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  share.connections_ = wanted;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(needed)) {
    const long long room =
        (static_cast<long long>(limit.rlim_cur) - kOtherDescriptors - promised) / descriptors_each;
    share.connections_ = static_cast<int>(std::min<long long>(wanted, std::max(room, 16LL)));
  }
  share.descriptors_ = static_cast<long long>(share.connections_) * descriptors_each;
  promised += share.descriptors_;
  return share;
}

DescriptorShare::DescriptorShare(DescriptorShare&& other) noexcept
    : connections_(std::exchange(other.connections_, 0)),
      descriptors_(std::exchange(other.descriptors_, 0)) {}

DescriptorShare& DescriptorShare::operator=(DescriptorShare&& other) noexcept {
  if (this != &other) {
    DescriptorShare released(std::move(*this));
    connections_ = std::exchange(other.connections_, 0);
    descriptors_ = std::exchange(other.descriptors_, 0);
  }
  return *this;
}

DescriptorShare::~DescriptorShare() {
  if (descriptors_ == 0) return;
  std::lock_guard<std::mutex> lock(promised_mu);
  promised -= descriptors_;
}

}  // namespace precompile
