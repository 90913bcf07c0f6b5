#include "server/api/control_access.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace precompile::server {
namespace {

// True when `given` is "Bearer <token>". The comparison takes the same time
// wherever the values differ.
bool IsBearer(absl::string_view given, const std::string& token) {
  const std::string expected = "Bearer " + token;
  if (given.size() != expected.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned char>(given[i] ^ expected[i]);
  }
  return diff == 0;
}

// True when the call's "authorization" metadata is "Bearer <token>".
bool CarriesToken(const grpc::ServerContext& context, const std::string& token) {
  auto it = context.client_metadata().find("authorization");
  if (it == context.client_metadata().end()) return false;
  return IsBearer(absl::string_view(it->second.data(), it->second.size()), token);
}

constexpr char kControlOff[] =
    "model control (load, unload, rescan) is off: start the server with "
    "--admin_token_file=FILE and send 'authorization: Bearer <token>', or, "
    "for local development only, with --allow_unauthenticated_control";

grpc::Status Unauthenticated() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "this call needs the admin token: metadata "
                      "'authorization: Bearer <token>'");
}

}  // namespace

grpc::Status ControlAccess::CheckRead(const grpc::ServerContext& context) const {
  if (token_.empty() || CarriesToken(context, token_)) return grpc::Status::OK;
  return Unauthenticated();
}

grpc::Status ControlAccess::CheckControl(const grpc::ServerContext& context) const {
  if (!token_.empty()) return CarriesToken(context, token_) ? grpc::Status::OK : Unauthenticated();
  if (allow_unauthenticated_) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, kControlOff);
}

absl::Status ControlAccess::CheckControlHeader(const char* authorization) const {
  if (!token_.empty()) {
    if (authorization != nullptr && IsBearer(authorization, token_)) return absl::OkStatus();
    return absl::UnauthenticatedError(
        "this call needs the admin token: header 'Authorization: Bearer <token>'");
  }
  if (allow_unauthenticated_) return absl::OkStatus();
  return absl::PermissionDeniedError(kControlOff);
}

absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path) {
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("admin token file ", path, ": ", why));
  };
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail("not a regular file");
  if (st.st_mode & S_IROTH) {
    return fail(absl::StrFormat("readable by every user (mode %03o); make it readable by "
                                "the server's user or group only (chmod 600 or 640)",
                                st.st_mode & 0777));
  }
  if (static_cast<uint64_t>(st.st_size) > kMaxAdminTokenBytes) {
    return fail(absl::StrCat("longer than ", kMaxAdminTokenBytes, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("cannot be read");
  const std::string contents((std::istreambuf_iterator<char>(in)), {});
  std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) return fail("empty");
  return token;
}

}  // namespace precompile::server
