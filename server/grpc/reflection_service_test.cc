// ReflectionService on a real gRPC server on loopback, asked by gRPC's own
// stub: a stream that asks nothing for the idle timeout is ended and gives
// its slot back; one that keeps asking is not.
#include "server/grpc/reflection_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace precompile::server {
namespace {

using grpc::reflection::v1alpha::ServerReflection;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

class ReflectionServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&reflection_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = ServerReflection::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  // Lists the services on `stream`: true if it answered.
  static bool List(
      grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>& stream) {
    ServerReflectionRequest request;
    request.set_list_services("*");
    ServerReflectionResponse response;
    return stream.Write(request) && stream.Read(&response) &&
           response.list_services_response().service_size() == 1;
  }

  // One stream at most, ended after 300 ms without a request.
  ReflectionService reflection_{
      {"grpc.reflection.v1alpha.ServerReflection"}, 1, absl::Milliseconds(300)};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ServerReflection::Stub> stub_;
};

TEST_F(ReflectionServiceTest, AStreamThatAsksNothingIsEndedAndItsSlotComesBack) {
  grpc::ClientContext context;
  // Were it never ended, the test fails here rather than hang.
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub_->ServerReflectionInfo(&context);
  ASSERT_TRUE(List(*stream));
  // The one slot is taken: another stream is refused.
  {
    grpc::ClientContext other_context;
    auto other = stub_->ServerReflectionInfo(&other_context);
    ServerReflectionResponse response;
    EXPECT_FALSE(other->Read(&response));
    EXPECT_EQ(other->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // Asking nothing: the server ends the stream.
  ServerReflectionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ended.error_message(),
            "this reflection stream asked nothing for 300ms, so the server ended it; open "
            "another to ask again");
  // Its slot comes back once gRPC is done with it.
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext again_context;
    auto again = stub_->ServerReflectionInfo(&again_context);
    if (List(*again)) {
      again->WritesDone();
      EXPECT_TRUE(again->Finish().ok());
      break;
    }
    again->Finish();
    ASSERT_LT(attempt, 100) << "the ended stream's slot never came back";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST_F(ReflectionServiceTest, AStreamThatKeepsAskingIsKept) {
  grpc::ClientContext context;
  auto stream = stub_->ServerReflectionInfo(&context);
  // Twice the idle timeout, asking every 100 ms.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(List(*stream)) << "request " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace precompile::server
