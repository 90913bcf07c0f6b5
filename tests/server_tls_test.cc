// TLS and mutual TLS with certificates from flags: a client without TLS, or
// without a certificate where one is required, gets nothing; a client that
// trusts the CA (and presents a certificate it signed) is served.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "proto/inference.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/artifacts.h"

namespace precompile {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A CA, a server certificate for 127.0.0.1/localhost and a client
// certificate, made with the openssl command line.
class Certificates {
 public:
  Certificates() : dir_(testing::NewTempDirectory("tls")) {
    Run("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca "
        "-keyout ca.key -out ca.crt");
    for (const char* who : {"server", "client"}) {
      Run(std::string("openssl req -newkey rsa:2048 -nodes -subj /CN=") + who + " -keyout " +
          who + ".key -out " + who + ".csr");
      std::ofstream(dir_ + "/" + who + ".ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
      Run(std::string("openssl x509 -req -in ") + who +
          ".csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile " + who +
          ".ext -out " + who + ".crt");
    }
  }
  std::string Path(const std::string& file) const { return dir_ + "/" + file; }

 private:
  void Run(const std::string& command) {
    const std::string full = "cd " + dir_ + " && " + command + " >/dev/null 2>&1";
    ASSERT_EQ(std::system(full.c_str()), 0) << command;
  }
  std::string dir_;
};

std::unique_ptr<server::Server> StartTls(const Certificates& certs, bool require_client) {
  server::ServerOptions options;
  options.model_repository = testing::ExampleRepository({"mlp"});
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.tls_cert_file = certs.Path("server.crt");
  options.tls_key_file = certs.Path("server.key");
  if (require_client) options.tls_client_ca_file = certs.Path("ca.crt");
  auto server = server::Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

grpc::Status Live(const std::shared_ptr<grpc::ChannelCredentials>& credentials, int port) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto channel =
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), credentials, args);
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  inference::ServerLiveResponse response;
  return stub->ServerLive(&context, {}, &response);
}

TEST(ServerTls, ServesOnlyClientsThatSpeakTlsAndTrustItsCertificate) {
  Certificates certs;
  auto server = StartTls(certs, /*require_client=*/false);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Live(grpc::InsecureChannelCredentials(), server->grpc_port()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions untrusting;  // the system roots do not know our CA
  untrusting.pem_root_certs = Read(certs.Path("client.crt"));
  EXPECT_FALSE(Live(grpc::SslCredentials(untrusting), server->grpc_port()).ok());
  grpc::SslCredentialsOptions trusting;
  trusting.pem_root_certs = Read(certs.Path("ca.crt"));
  grpc::Status status = Live(grpc::SslCredentials(trusting), server->grpc_port());
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(ServerTls, MutualTlsRequiresAClientCertificateSignedByTheCa) {
  Certificates certs;
  auto server = StartTls(certs, /*require_client=*/true);
  ASSERT_NE(server, nullptr);
  grpc::SslCredentialsOptions anonymous;
  anonymous.pem_root_certs = Read(certs.Path("ca.crt"));
  EXPECT_FALSE(Live(grpc::SslCredentials(anonymous), server->grpc_port()).ok());
  grpc::SslCredentialsOptions mutual = anonymous;
  mutual.pem_private_key = Read(certs.Path("client.key"));
  mutual.pem_cert_chain = Read(certs.Path("client.crt"));
  grpc::Status status = Live(grpc::SslCredentials(mutual), server->grpc_port());
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(ServerTls, RefusesIncompleteTlsFlags) {
  server::ServerOptions options;
  options.model_repository = testing::ExampleRepository({"mlp"});
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.tls_cert_file = "/nonexistent.crt";
  auto server = server::Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("needs both a certificate"));
  options.tls_cert_file = "";
  options.tls_client_ca_file = "/ca.crt";
  server = server::Server::Start(options);
  EXPECT_THAT(server.status().message(), HasSubstr("--tls_client_ca needs --tls_cert"));
}

}  // namespace
}  // namespace precompile
