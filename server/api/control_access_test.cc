#include "server/api/control_access.h"

#include <grpcpp/test/server_context_test_spouse.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

grpc::StatusCode Read(const ControlAccess& access, const std::string& authorization = "") {
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (!authorization.empty()) spouse.AddClientMetadata("authorization", authorization);
  return access.CheckRead(context).error_code();
}

grpc::Status Control(const ControlAccess& access, const std::string& authorization = "") {
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  if (!authorization.empty()) spouse.AddClientMetadata("authorization", authorization);
  return access.CheckControl(context);
}

TEST(ControlAccess, WithoutATokenControlIsOffAndSaysHowToTurnItOn) {
  const ControlAccess access("", /*allow_unauthenticated=*/false);
  const grpc::Status refused = Control(access);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--admin_token_file"));
  EXPECT_THAT(refused.error_message(), HasSubstr("--allow_unauthenticated_control"));
  // A bearer token changes nothing when the server has none.
  EXPECT_EQ(Control(access, "Bearer guess").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Read(access), grpc::StatusCode::OK);
}

// Over HTTP the same rules read the Authorization header.
TEST(ControlAccess, AnHttpAuthorizationHeaderIsCheckedAsTheMetadataIs) {
  const ControlAccess off("", /*allow_unauthenticated=*/false);
  EXPECT_EQ(off.CheckControlHeader(nullptr).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(off.CheckControlHeader("Bearer guess").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(ControlAccess("", true).CheckControlHeader(nullptr).ok());
  for (bool allow : {false, true}) {
    const ControlAccess access("s3cret", allow);
    EXPECT_TRUE(access.CheckControlHeader("Bearer s3cret").ok());
    for (const char* wrong : {"", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "s3cret"}) {
      const absl::Status refused = access.CheckControlHeader(wrong);
      EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << wrong;
      EXPECT_THAT(refused.message(), HasSubstr("Authorization: Bearer <token>"));
    }
    EXPECT_EQ(access.CheckControlHeader(nullptr).code(), absl::StatusCode::kUnauthenticated);
  }
}

TEST(ControlAccess, TheExplicitFlagAllowsControlWithoutAToken) {
  const ControlAccess access("", /*allow_unauthenticated=*/true);
  EXPECT_TRUE(Control(access).ok());
  EXPECT_EQ(Read(access), grpc::StatusCode::OK);
}

TEST(ControlAccess, WithATokenBothNeedIt) {
  for (bool allow : {false, true}) {
    const ControlAccess access("s3cret", allow);
    EXPECT_TRUE(Control(access, "Bearer s3cret").ok());
    EXPECT_EQ(Read(access, "Bearer s3cret"), grpc::StatusCode::OK);
    for (const std::string& wrong :
         std::vector<std::string>{"", "Bearer s3cre", "Bearer s3cret ", "bearer s3cret",
                                  "Bearer S3cret", "s3cret", std::string(5000, 'x')}) {
      EXPECT_EQ(Control(access, wrong).error_code(), grpc::StatusCode::UNAUTHENTICATED) << wrong;
      EXPECT_EQ(Read(access, wrong), grpc::StatusCode::UNAUTHENTICATED) << wrong;
    }
  }
}

class TokenFile : public ::testing::Test {
 protected:
  std::string Write(const std::string& contents, mode_t mode) {
    const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/token";
    std::remove(path.c_str());
    std::ofstream(path) << contents;
    chmod(path.c_str(), mode);
    return path;
  }
};

TEST_F(TokenFile, ATrailingNewlineIsNotPartOfTheToken) {
  absl::StatusOr<std::string> token = ReadAdminTokenFile(Write("s3cret\n", 0600));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  EXPECT_TRUE(ReadAdminTokenFile(Write("s3cret", 0640)).ok());
}

TEST_F(TokenFile, RefusesWhatShouldNotHoldASecretNamingTheFileAndTheReason) {
  struct Case {
    std::string contents;
    mode_t mode;
    std::string reason;
  };
  for (const Case& c : {Case{"s3cret\n", 0644, "readable by every user (mode 644)"},
                        Case{"s3cret\n", 0604, "readable by every user (mode 604)"},
                        Case{"", 0600, "empty"},
                        Case{" \n\t\n", 0600, "empty"},
                        Case{std::string(4097, 'x'), 0600, "longer than 4096 bytes"}}) {
    const std::string path = Write(c.contents, c.mode);
    absl::StatusOr<std::string> token = ReadAdminTokenFile(path);
    ASSERT_FALSE(token.ok()) << c.reason;
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(token.status().message(), HasSubstr("admin token file " + path + ": " + c.reason));
    EXPECT_THAT(token.status().message(), Not(HasSubstr("s3cret")));
  }
  absl::StatusOr<std::string> missing = ReadAdminTokenFile("/no/such/token");
  EXPECT_THAT(missing.status().message(),
              HasSubstr("admin token file /no/such/token: No such file or directory"));
  absl::StatusOr<std::string> directory = ReadAdminTokenFile(std::getenv("TEST_TMPDIR"));
  EXPECT_THAT(directory.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace precompile::server
