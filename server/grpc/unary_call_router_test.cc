// UnaryCallRouter on a real gRPC server on loopback, called by gRPC's own
// stubs: routed methods answered, requests past the limit refused before
// any handler sees them, and what is not routed or does not parse refused
// by name while the router serves on.
#include "server/grpc/unary_call_router.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/inference.grpc.pb.h"

namespace precompile::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr size_t kLimit = 1024;

const google::protobuf::ServiceDescriptor& Inference() {
  return *inference::ServerLiveRequest::descriptor()->file()->FindServiceByName(
      "GRPCInferenceService");
}

// Answers ModelMetadata with the name it was asked, and throws for a model
// named "throw".
class Methods {
 public:
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) {
    ++calls;
    if (request->name() == "throw") throw std::runtime_error("a handler's own failure");
    response->set_name(request->name());
    return grpc::Status::OK;
  }
  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* response) {
    response->set_live(true);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not today");
  }
  // Waits until `release` is notified: a model load, as long as it takes.
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest*,
                          inference::ModelReadyResponse* response) {
    ++waiting;
    release.WaitForNotification();
    response->set_ready(true);
    return grpc::Status::OK;
  }
  // The wrong types for ModelReady.
  grpc::Status NotModelReady(grpc::ServerContext*, const inference::ServerLiveRequest*,
                             inference::ServerLiveResponse*) {
    return grpc::Status::OK;
  }

  std::atomic<int> calls{0};
  std::atomic<int> waiting{0};
  Notification release;
};

class UnaryCallRouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    router_.Add(Inference(), "ModelMetadata", &methods_, &Methods::ModelMetadata);
    router_.Add(Inference(), "ServerLive", &methods_, &Methods::ServerLive);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterAsyncGenericService(router_.generic_service());
    std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    router_.StartServing(std::move(cq));
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    stub_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    server_->Shutdown();
    router_.StopServing();
  }

  grpc::Status Metadata(const std::string& name, inference::ModelMetadataResponse* response) {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name(name);
    return stub_->ModelMetadata(&context, request, response);
  }

  Methods methods_;
  UnaryCallRouter router_{2, kLimit};
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub_;
};

TEST_F(UnaryCallRouterTest, ARoutedMethodGetsItsHandlersAnswer) {
  inference::ModelMetadataResponse response;
  ASSERT_TRUE(Metadata("mlp", &response).ok());
  EXPECT_EQ(response.name(), "mlp");
  // A handler's error reaches the client as it said it.
  grpc::ClientContext context;
  inference::ServerLiveResponse live;
  const grpc::Status status = stub_->ServerLive(&context, inference::ServerLiveRequest(), &live);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(status.error_message(), "not today");
}

TEST_F(UnaryCallRouterTest, ARequestPastTheLimitIsRefusedBeforeItsHandlerRuns) {
  inference::ModelMetadataResponse response;
  // The largest request taken: 1024 bytes of message.
  ASSERT_TRUE(Metadata(std::string(kLimit - 3, 'm'), &response).ok());
  EXPECT_EQ(methods_.calls.load(), 1);
  const grpc::Status status = Metadata(std::string(kLimit - 2, 'm'), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(status.error_message(),
            "the request of 1025 bytes is more than the 1024 bytes "
            "/inference.GRPCInferenceService/ModelMetadata takes (only ModelInfer takes larger "
            "messages)");
  EXPECT_EQ(methods_.calls.load(), 1);
  ASSERT_TRUE(Metadata("next", &response).ok());
  EXPECT_EQ(response.name(), "next");
}

TEST_F(UnaryCallRouterTest, AMethodNotRoutedIsUnimplemented) {
  grpc::ClientContext context;
  inference::ModelReadyResponse response;
  const grpc::Status status =
      stub_->ModelReady(&context, inference::ModelReadyRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(status.error_message(),
            "this server has no method '/inference.GRPCInferenceService/ModelReady'");
}

TEST_F(UnaryCallRouterTest, BytesThatDoNotParseAreRefusedNamingTheRequestType) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  const std::string garbage = "\xff\xff\xff";
  grpc::Slice slice(garbage);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/inference.GRPCInferenceService/ModelMetadata", grpc::StubOptions(),
                    &request, &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "the request is not a ModelMetadataRequest (it does not parse)");
  EXPECT_EQ(methods_.calls.load(), 0);
}

TEST_F(UnaryCallRouterTest, AHandlerThatThrowsIsAnsweredInternalAndTheRouterServesOn) {
  inference::ModelMetadataResponse response;
  for (int i = 0; i < 3; ++i) {  // More than the router's threads.
    const grpc::Status status = Metadata("throw", &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL);
    EXPECT_EQ(status.error_message(),
              "/inference.GRPCInferenceService/ModelMetadata failed inside the server; it has "
              "logged why");
  }
  ASSERT_TRUE(Metadata("after", &response).ok());
  EXPECT_EQ(response.name(), "after");
}

// Two loads wait in their lane, one at a time, on a router of one thread:
// the other methods are answered meanwhile, and so is a load its admission
// refuses.
TEST(UnaryCallRouterLanes, HandlersOneAtATimeNeverHoldTheCallThreads) {
  Methods methods;
  UnaryCallRouter router(1, kLimit);
  router.Add(Inference(), "ModelMetadata", &methods, &Methods::ModelMetadata);
  router.Add(Inference(), "ModelReady", &methods, &Methods::ModelReady,
             UnaryCallRouter::Lane::kOneAtATime, [](const grpc::ServerContext& context) {
               return context.client_metadata().count("token") > 0
                          ? grpc::Status::OK
                          : grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no token");
             });
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterAsyncGenericService(router.generic_service());
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  router.StartServing(std::move(cq));
  auto stub = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  std::vector<std::thread> loads;
  std::atomic<int> loaded{0};
  for (int i = 0; i < 2; ++i) {
    loads.emplace_back([&] {
      grpc::ClientContext context;
      context.AddMetadata("token", "1");
      inference::ModelReadyResponse response;
      if (stub->ModelReady(&context, inference::ModelReadyRequest(), &response).ok()) ++loaded;
    });
  }
  while (methods.waiting.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    // Were the load on the one call thread, this would wait for it.
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    inference::ModelMetadataRequest request;
    request.set_name("meanwhile");
    inference::ModelMetadataResponse response;
    EXPECT_TRUE(stub->ModelMetadata(&context, request, &response).ok());
    EXPECT_EQ(response.name(), "meanwhile");
  }
  {
    // A load its admission refuses is answered at once, not behind the
    // loads waiting in the lane, and never runs.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    inference::ModelReadyResponse response;
    const grpc::Status refused =
        stub->ModelReady(&context, inference::ModelReadyRequest(), &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(refused.error_message(), "no token");
  }
  // One at a time: the second load has not started.
  EXPECT_EQ(methods.waiting.load(), 1);
  methods.release.Notify();
  for (std::thread& t : loads) t.join();
  EXPECT_EQ(loaded.load(), 2);
  EXPECT_EQ(methods.waiting.load(), 2);
  server->Shutdown();
  router.StopServing();
}

TEST(UnaryCallRouterRoutes, CheckRoutesNamesTheMethodsLeftAndTheHandlersOfTheWrongTypes) {
  Methods methods;
  UnaryCallRouter router(1, kLimit);
  router.Add(Inference(), "ModelMetadata", &methods, &Methods::ModelMetadata);
  router.Add(Inference(), "ModelReady", &methods, &Methods::NotModelReady);
  router.Add(Inference(), "NoSuchMethod", &methods, &Methods::ServerLive);
  const absl::Status status = router.CheckRoutes(Inference(), {"ModelInfer"});
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(),
              HasSubstr("/inference.GRPCInferenceService/ModelReady takes "
                        "inference.ModelReadyRequest and returns inference.ModelReadyResponse "
                        "(unary): its handler takes inference.ServerLiveRequest"));
  EXPECT_THAT(status.message(),
              HasSubstr("/inference.GRPCInferenceService/NoSuchMethod is not a method of "
                        "inference.GRPCInferenceService"));
  EXPECT_THAT(status.message(),
              HasSubstr("/inference.GRPCInferenceService/ServerLive has no handler"));
  EXPECT_THAT(status.message(), Not(HasSubstr("ModelMetadata")));
  EXPECT_THAT(status.message(), Not(HasSubstr("ModelInfer")));

  // Every method routed or served elsewhere: nothing to say.
  std::vector<std::string> elsewhere;
  for (int i = 0; i < Inference().method_count(); ++i) {
    if (Inference().method(i)->name() != "ModelMetadata") {
      elsewhere.push_back(Inference().method(i)->name());
    }
  }
  UnaryCallRouter complete(1, kLimit);
  complete.Add(Inference(), "ModelMetadata", &methods, &Methods::ModelMetadata);
  EXPECT_TRUE(complete.CheckRoutes(Inference(), elsewhere).ok());
}

}  // namespace
}  // namespace precompile::server
