// A lost accelerator (a poisoned CUDA context: every later call on the
// device fails) turns the real server's liveness red, over KServe's
// ServerLive and the gRPC health service the Kubernetes probes ask, so that
// the pod is restarted. The loss itself needs a GPU whose compiled code hits
// a device-side assert; here the runtime's report of one is the edge, made
// by hand. Its own binary: the report is for the whole process.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"
#include "runtime/device_health.h"
#include "server/server.h"
#include "tests/testing/artifacts.h"

namespace precompile {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

TEST(DeviceLost, TheServerIsNoLongerLiveNorReady) {
  server::ServerOptions options;
  options.model_repository = testing::ExampleRepository({"mlp"});
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  auto server = server::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto live = [&] {
    grpc::ClientContext context;
    inference::ServerLiveResponse response;
    EXPECT_TRUE(inference->ServerLive(&context, {}, &response).ok());
    return response.live();
  };
  auto serving = [&] {
    grpc::ClientContext context;
    HealthCheckResponse response;
    EXPECT_TRUE(health->Check(&context, HealthCheckRequest(), &response).ok());
    return response.status() == HealthCheckResponse::SERVING;
  };
  ASSERT_TRUE(live());
  ASSERT_TRUE(serving());

  ReportDeviceLost("running variant forward#0: CUDA error: device-side assert triggered");
  // The server's watchdog looks once a second.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (live() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(live());
  EXPECT_FALSE(serving());
  EXPECT_TRUE((*server)->Stop().ok());
}

}  // namespace
}  // namespace precompile
