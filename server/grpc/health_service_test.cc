// HealthService on a real gRPC server on loopback, asked by gRPC's own
// stubs: what Check and Watch answer as statuses change, requests past the
// limit refused unparsed, the Watch limit, and Shutdown ending the streams.
#include "server/grpc/health_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr int kMaxWatches = 2;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(false);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = Health::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    health_.Shutdown();
    server_->Shutdown();
  }

  grpc::Status Check(const std::string& service, HealthCheckResponse* response) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    return stub_->Check(&context, request, response);
  }

  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
    // The next status written, or -1 when the stream ended.
    int Next() {
      HealthCheckResponse response;
      return reader->Read(&response) ? response.status() : -1;
    }
  };
  std::unique_ptr<Watch> StartWatch(const std::string& service) {
    auto watch = std::make_unique<Watch>();
    HealthCheckRequest request;
    request.set_service(service);
    watch->reader = stub_->Watch(&watch->context, request);
    return watch;
  }

  HealthService health_{kMaxWatches};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckAnswersWhatWasSetAndNotFoundForWhatWasNot) {
  HealthCheckResponse response;
  EXPECT_EQ(Check("", &response).error_code(), grpc::StatusCode::NOT_FOUND);
  health_.SetServingStatus("", true);
  health_.SetServingStatus("mlp", false);
  ASSERT_TRUE(Check("", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check("mlp", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  const grpc::Status unknown = Check("bert", &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_message(), "unknown service");
}

TEST_F(HealthServiceTest, ARequestPastFourKibibytesIsRefusedUnparsed) {
  health_.SetServingStatus("", true);
  HealthCheckResponse response;
  // 4096 bytes of request: a tag, two bytes of length, 4093 of name.
  EXPECT_EQ(Check(std::string(4093, 's'), &response).error_code(), grpc::StatusCode::NOT_FOUND);
  const grpc::Status refused = Check(std::string(4094, 's'), &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(), "a health check request of 4097 bytes; at most 4096 are read");
  std::unique_ptr<Watch> watch = StartWatch(std::string(4094, 's'));
  EXPECT_EQ(watch->Next(), -1);
  EXPECT_EQ(watch->reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(Check("", &response).ok());
}

TEST_F(HealthServiceTest, WatchWritesEachChangeAndShutdownEndsTheStream) {
  health_.SetServingStatus("", false);
  std::unique_ptr<Watch> server = StartWatch("");
  std::unique_ptr<Watch> model = StartWatch("mlp");
  EXPECT_EQ(server->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(model->Next(), HealthCheckResponse::SERVICE_UNKNOWN);
  health_.SetServingStatus("mlp", true);
  EXPECT_EQ(model->Next(), HealthCheckResponse::SERVING);
  health_.SetServingStatus("", true);
  EXPECT_EQ(server->Next(), HealthCheckResponse::SERVING);
  health_.Shutdown();
  EXPECT_EQ(server->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(server->Next(), -1);
  const grpc::Status ended = server->reader->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ended.error_message(), "the server is shutting down");
  EXPECT_EQ(model->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(model->Next(), -1);
  // Nothing brings a status back after Shutdown.
  health_.SetServingStatus("", true);
  HealthCheckResponse response;
  ASSERT_TRUE(Check("", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchesPastTheLimitAreRefusedUntilOneEnds) {
  health_.SetServingStatus("", true);
  std::vector<std::unique_ptr<Watch>> open;
  for (int i = 0; i < kMaxWatches; ++i) {
    open.push_back(StartWatch(""));
    EXPECT_EQ(open.back()->Next(), HealthCheckResponse::SERVING);
  }
  std::unique_ptr<Watch> refused = StartWatch("");
  EXPECT_EQ(refused->Next(), -1);
  const grpc::Status status = refused->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "the server has 2 health Watch streams open, its limit; close one and try again");
  // A client that goes gives its stream back.
  open.front()->context.TryCancel();
  EXPECT_EQ(open.front()->Next(), -1);
  open.front()->reader->Finish();
  open.erase(open.begin());
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<Watch> again = StartWatch("");
    if (again->Next() == HealthCheckResponse::SERVING) break;
    again->reader->Finish();
    // The server forgets the cancelled stream once gRPC has ended it.
    ASSERT_LT(attempt, 100) << "the cancelled Watch's slot never came back";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace
}  // namespace precompile::server
