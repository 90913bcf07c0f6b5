#include "client/client_options.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/retry.h"

namespace precompile::client {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, 3600 * 1000));
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options,
                                                             int max_attempts) {
  ClientOptions with_attempts = options;
  with_attempts.retry.max_attempts = max_attempts;
  return CreateChannel(with_attempts);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateChannel(const ClientOptions& options) {
  if (options.address.empty()) return absl::InvalidArgumentError("no server address");
  absl::StatusOr<std::string> service_config = RetryServiceConfig(options.retry);
  if (!service_config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry policy: ", service_config.status().message()));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetServiceConfigJSON(*service_config);
  // The policy is the client's to set, not a name resolver's.
  args.SetInt(GRPC_ARG_SERVICE_CONFIG_DISABLE_RESOLUTION, 1);
  // gRPC retries a call only while it holds the whole request, by default
  // up to 256 KiB: an inference request may be as large as a message.
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, options.max_message_bytes);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: despite its name it is the least
  // time a connection attempt (the TLS handshake included) is given.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Milliseconds(options.retry.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Milliseconds(options.retry.max_backoff));

  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const TlsOptions& tls = options.tls;
  if (!tls.Enabled()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    if (tls.client_cert_file.empty() != tls.client_key_file.empty()) {
      return absl::InvalidArgumentError(
          "mutual TLS needs both a client certificate and its private key");
    }
    grpc::SslCredentialsOptions ssl;
    if (!tls.root_ca_file.empty()) {
      absl::StatusOr<std::string> roots = ReadPem(tls.root_ca_file, "TLS root CA");
      if (!roots.ok()) return roots.status();
      ssl.pem_root_certs = *std::move(roots);
    }
    if (!tls.client_cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadPem(tls.client_cert_file, "client certificate");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem(tls.client_key_file, "client key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    if (!tls.server_name_override.empty()) {
      args.SetSslTargetNameOverride(tls.server_name_override);
    }
    credentials = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(options.address, credentials, args);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the token file ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  return token;
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace precompile::client
