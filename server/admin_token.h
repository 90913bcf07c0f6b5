// The check that guards calls which change what the server serves (admin
// calls, repository load and unload) when the server has an admin token.
#ifndef PRECOMPILE_SERVER_ADMIN_TOKEN_H_
#define PRECOMPILE_SERVER_ADMIN_TOKEN_H_

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace precompile::server {

// OK when `token` is empty or the call's "authorization" metadata is
// "Bearer <token>"; UNAUTHENTICATED otherwise. The comparison takes the same
// time wherever the values differ.
inline grpc::Status CheckAdminToken(const grpc::ServerContext& context,
                                    const std::string& token) {
  if (token.empty()) return grpc::Status::OK;
  const std::string expected = "Bearer " + token;
  auto it = context.client_metadata().find("authorization");
  if (it != context.client_metadata().end()) {
    absl::string_view given(it->second.data(), it->second.size());
    if (given.size() == expected.size()) {
      unsigned char diff = 0;
      for (size_t i = 0; i < given.size(); ++i) {
        diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
      }
      if (diff == 0) return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this call needs the admin token: metadata "
                      "'authorization: Bearer <token>'");
}

// Reads a secret (such as the admin token) from a file, without the
// surrounding whitespace. The secret itself never appears in an error.
inline absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  std::string secret(absl::StripAsciiWhitespace(contents.str()));
  if (secret.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " is empty"));
  return secret;
}

}  // namespace precompile::server

#endif  // PRECOMPILE_SERVER_ADMIN_TOKEN_H_
