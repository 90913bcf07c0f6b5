// The RPC floor: a KServe v2 ModelInfer server with no model.
//
// It answers ModelInfer the way precompile_server does (same gRPC version,
// same synchronous server, same message limits, same response fields) but
// instead of running a model it copies each request tensor's bytes into the
// response as output<i> with the input's datatype and shape. Driven by
// precompile_load with the same request mix as the real server, it measures
// what gRPC, protobuf and the load generator cost on their own.
//
//   echo_server --port=18101 [--grpc_threads=0] [--max_message_bytes=N]
//
// ServerLive / ServerReady / ModelReady answer true, so scripts can wait on it.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/inference.grpc.pb.h"

ABSL_FLAG(std::string, listen_address, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 18101, "gRPC port");
ABSL_FLAG(int, grpc_threads, 0, "threads serving gRPC calls (0: gRPC's default)");
ABSL_FLAG(int, max_message_bytes, 256 << 20, "largest request or response");

namespace {

class EchoService final : public inference::GRPCInferenceService::Service {
 public:
  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* response) override {
    response->set_live(true);
    return grpc::Status::OK;
  }
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* response) override {
    response->set_ready(true);
    return grpc::Status::OK;
  }
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest*,
                          inference::ModelReadyResponse* response) override {
    response->set_ready(true);
    return grpc::Status::OK;
  }

  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override {
    if (request->raw_input_contents_size() != request->inputs_size()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "echo_server takes raw_input_contents only");
    }
    response->set_model_name(request->model_name());
    response->set_model_version("1");
    response->set_id(request->id());
    // The same two response parameters precompile_server sets.
    auto& params = *response->mutable_parameters();
    params["precompile_outcome"].set_string_param("echo");
    params["precompile_variant"].set_string_param("");
    for (int i = 0; i < request->inputs_size(); ++i) {
      const auto& in = request->inputs(i);
      auto* out = response->add_outputs();
      out->set_name(absl::StrCat("output", i));
      out->set_datatype(in.datatype());
      for (int64_t d : in.shape()) out->add_shape(d);
      // A copy, as precompile_server copies each output tensor.
      response->add_raw_output_contents(request->raw_input_contents(i));
    }
    return grpc::Status::OK;
  }
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Stop on SIGTERM/SIGINT: a thread waits for them and shuts the server down.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      absl::StrCat(absl::GetFlag(FLAGS_listen_address), ":", absl::GetFlag(FLAGS_port)),
      grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  builder.SetMaxSendMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  // The floor uses gRPC as precompile_server does (server/server.cc and
  // main.cc): pollers kept between bursts, no abseil deadlock detection.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 64);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::GetFlag(FLAGS_grpc_threads) > 0) {
    grpc::ResourceQuota quota("echo-server");
    quota.SetMaxThreads(absl::GetFlag(FLAGS_grpc_threads));
    builder.SetResourceQuota(quota);
  }
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    fprintf(stderr, "echo_server: cannot listen on port %d\n", absl::GetFlag(FLAGS_port));
    return 1;
  }
  fprintf(stderr, "echo_server: listening on port %d\n", port);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    server->Shutdown();
  });
  server->Wait();
  waiter.join();
  return 0;
}
