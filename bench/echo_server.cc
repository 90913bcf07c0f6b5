// The RPC floor: a KServe v2 ModelInfer server with no model.
//
// It answers ModelInfer the way precompile_server does (same gRPC version,
// same asynchronous API with one thread per core plus one, same message
// limits, same response fields) but
// instead of running a model it copies each request tensor's bytes into the
// response as output<i> with the input's datatype and shape. Driven by
// precompile_load with the same request mix as the real server, it measures
// what gRPC, protobuf and the load generator cost on their own.
//
//   echo_server --port=18101 [--grpc_threads=0] [--max_message_bytes=N]
//               [--api=async|sync|callback]
//
// --api picks how ModelInfer is served, for comparing gRPC's APIs on their
// own: async (precompile_server's way), sync (a handler per poller thread)
// or callback (a reactor run on gRPC's own threads).
//
// ServerLive / ServerReady / ModelReady answer true, so scripts can wait on it.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/inference.grpc.pb.h"

ABSL_FLAG(std::string, listen_address, "127.0.0.1", "address to listen on");
ABSL_FLAG(int, port, 18101, "gRPC port");
ABSL_FLAG(int, grpc_threads, 0, "threads serving gRPC calls (0: gRPC's default)");
ABSL_FLAG(int, max_message_bytes, 256 << 20, "largest request or response");
ABSL_FLAG(int, async_threads, 0,
          "threads answering ModelInfer with --api=async (0: one per core of the "
          "machine, plus one; precompile_server counts only the cores it may run on)");
ABSL_FLAG(std::string, api, "async", "gRPC API serving ModelInfer: async, sync or callback");

namespace {

grpc::Status Echo(const inference::ModelInferRequest& request,
                  inference::ModelInferResponse* response) {
  if (request.raw_input_contents_size() != request.inputs_size()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "echo_server takes raw_input_contents only");
  }
  response->set_model_name(request.model_name());
  response->set_model_version("1");
  response->set_id(request.id());
  // The same two response parameters precompile_server sets.
  auto& params = *response->mutable_parameters();
  params["precompile_outcome"].set_string_param("echo");
  params["precompile_variant"].set_string_param("");
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& in = request.inputs(i);
    auto* out = response->add_outputs();
    out->set_name(absl::StrCat("output", i));
    out->set_datatype(in.datatype());
    for (int64_t d : in.shape()) out->add_shape(d);
    // A copy, as precompile_server copies each output tensor.
    response->add_raw_output_contents(request.raw_input_contents(i));
  }
  return grpc::Status::OK;
}

class HealthAnswers : public inference::GRPCInferenceService::Service {
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
};

class SyncEchoService final : public HealthAnswers {
 public:
  grpc::Status ModelInfer(grpc::ServerContext*, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override {
    return Echo(*request, response);
  }
};

class CallbackEchoService final
    : public inference::GRPCInferenceService::WithCallbackMethod_ModelInfer<HealthAnswers> {
 public:
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(Echo(*request, response));
    return reactor;
  }
};

class AsyncEchoService final
    : public inference::GRPCInferenceService::WithAsyncMethod_ModelInfer<HealthAnswers> {};

// Calls are requested from the completion queue until it shuts down.
std::mutex cq_mu;
bool cq_shut_down = false;

// One ModelInfer call on the asynchronous API: requested, then answered.
class AsyncEchoCall {
 public:
  static void Request(AsyncEchoService* service, grpc::ServerCompletionQueue* cq) {
    std::lock_guard<std::mutex> lock(cq_mu);
    if (!cq_shut_down) new AsyncEchoCall(service, cq);
  }
  void Proceed(bool ok) {
    if (answered_ || !ok) {
      delete this;
      return;
    }
    Request(service_, cq_);
    answered_ = true;
    responder_.Finish(response_, Echo(request_, &response_), this);
  }

 private:
  AsyncEchoCall(AsyncEchoService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), responder_(&context_) {
    service_->RequestModelInfer(&context_, &request_, &responder_, cq_, cq_, this);
  }

  AsyncEchoService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext context_;
  inference::ModelInferRequest request_;
  inference::ModelInferResponse response_;
  grpc::ServerAsyncResponseWriter<inference::ModelInferResponse> responder_;
  bool answered_ = false;
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

  const std::string api = absl::GetFlag(FLAGS_api);
  if (api != "sync" && api != "callback" && api != "async") {
    fprintf(stderr, "echo_server: --api must be sync, callback or async, not %s\n",
            api.c_str());
    return 2;
  }
  SyncEchoService sync_service;
  CallbackEchoService callback_service;
  AsyncEchoService async_service;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
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
  if (api == "sync") {
    builder.RegisterService(&sync_service);
  } else if (api == "callback") {
    builder.RegisterService(&callback_service);
  } else {
    builder.RegisterService(&async_service);
    cq = builder.AddCompletionQueue();
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    fprintf(stderr, "echo_server: cannot listen on port %d\n", absl::GetFlag(FLAGS_port));
    return 1;
  }
  fprintf(stderr, "echo_server: listening on port %d\n", port);
  std::vector<std::thread> cq_threads;
  if (cq) {
    const int n = absl::GetFlag(FLAGS_async_threads) > 0
                      ? absl::GetFlag(FLAGS_async_threads)
                      : static_cast<int>(std::thread::hardware_concurrency()) + 1;
    for (int i = 0; i < 2 * n; ++i) AsyncEchoCall::Request(&async_service, cq.get());
    for (int i = 0; i < n; ++i) {
      cq_threads.emplace_back([&cq] {
        void* tag = nullptr;
        bool ok = false;
        while (cq->Next(&tag, &ok)) static_cast<AsyncEchoCall*>(tag)->Proceed(ok);
      });
    }
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    server->Shutdown();
  });
  server->Wait();
  waiter.join();
  if (cq) {
    {
      std::lock_guard<std::mutex> lock(cq_mu);
      cq_shut_down = true;
      cq->Shutdown();
    }
    for (std::thread& t : cq_threads) t.join();
  }
  return 0;
}
