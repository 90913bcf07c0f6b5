// How the client reaches a precompile-serve server: address, TLS, the admin
// token, deadlines and the retry policy, shared by InferenceClient and
// AdminClient.
#ifndef PRECOMPILE_CLIENT_CLIENT_OPTIONS_H_
#define PRECOMPILE_CLIENT_CLIENT_OPTIONS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace precompile::client {

struct TlsOptions {
  // Speak TLS. Default: false; any file or name below turns it on.
  bool enabled = false;
  // PEM roots that must have signed the server's certificate.
  // Default: gRPC's default roots.
  std::string root_ca_file;
  // PEM certificate chain and private key to present to a server that asks
  // for one (mutual TLS). REQUIRES: both or neither.
  std::string client_cert_file;
  std::string client_key_file;
  // The name the server's certificate must carry when it is not the host of
  // the address (an IP address, a tunnel). Default: the address's host.
  std::string server_name_override;

  bool Enabled() const {
    return enabled || !root_ca_file.empty() || !client_cert_file.empty() ||
           !client_key_file.empty() || !server_name_override.empty();
  }
};

// Retries of calls that failed with UNAVAILABLE: the code a server, a proxy
// or gRPC itself gives when the same call may succeed later (no connection,
// draining, restarting). No other code is retried: FAILED_PRECONDITION (no
// variant matches), INVALID_ARGUMENT and the rest fail the same way again.
// Only calls that change nothing on the server (inference, metadata,
// summaries, health) are retried; load, unload and rescan run once. gRPC
// makes the retries, under this policy as its channel's service config
// (retry.h).
struct RetryPolicy {
  // Attempts per call, the first included: from 1 (no retry) to 5, the most
  // gRPC makes. Default: 3.
  int max_attempts = 3;
  // Delay before the second attempt; each later one is `multiplier` times
  // longer, up to `max_backoff`. gRPC scales each delay by a random factor
  // in [0.8, 1.2], so that clients which failed together do not retry
  // together. Defaults: 100 ms, x2, 2 s.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  double multiplier = 2.0;
  absl::Duration max_backoff = absl::Seconds(2);
};

struct ClientOptions {
  // gRPC target: "host:port", "[::1]:port", "unix:/path", ...
  // Default: 127.0.0.1:8001, where precompile_server listens by default.
  std::string address = "127.0.0.1:8001";
  TlsOptions tls;
  // When non-empty, sent as "authorization: Bearer <token>" on the calls
  // that need it (the admin service, repository load and unload), and only
  // on those.
  std::string admin_token;
  // Deadline of a call, its retries included; absl::InfiniteDuration() for
  // none. Default: 30 s.
  absl::Duration timeout = absl::Seconds(30);
  RetryPolicy retry;
  // Largest message sent or received. Default: 256 MiB, the server's default.
  int max_message_bytes = 256 << 20;
  // Threads that complete asynchronous calls and run their callbacks.
  // Default: 1.
  int async_threads = 1;
};

// Per-call overrides of ClientOptions.
struct CallOptions {
  // Deadline of this call, its retries included.
  std::optional<absl::Duration> timeout;
  // Attempts for this call, from 1 (no retry) to 5. A count other than the
  // client's is served by a channel of the client's own for that count,
  // made at the first call that asks for it.
  std::optional<int> max_attempts;
};

// A channel to `options.address` with its TLS settings and its retry policy
// (retry.h). Reconnection after a failed connect is paced by the retry
// policy too (gRPC's own first reconnect delay is 1 s, which would make
// every retry in between fail at once). INVALID_ARGUMENT for inconsistent
// TLS options or a retry policy gRPC cannot follow; NOT_FOUND when a PEM
// file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options);

// The same with the retry policy's attempt count replaced: the channel for
// calls that ask for another count than the client's (CallOptions).
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options,
                                                             int max_attempts);

// Reads a token (such as the admin token) from a file, without surrounding
// whitespace. The token never appears in an error.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// grpc::Status as absl::Status: the codes are the same numbers.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_CLIENT_OPTIONS_H_
