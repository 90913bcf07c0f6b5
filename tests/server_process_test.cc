// The server binary as an operator runs it: started as a process, stopped
// with SIGTERM while a request is running. It must turn NOT_SERVING at once,
// finish the running request, and exit 0; or, past its drain deadline, exit
// non-zero and say what was still running.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/http.h"
#include "tests/testing/one_core.h"
#include "tests/testing/requests.h"

extern char** environ;

namespace precompile {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::precompile::testing::EndlessLoopRequest;
using ::precompile::testing::SlowLoopRequest;
using ::testing::HasSubstr;

std::string Runfile(const std::string& path) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/" + std::getenv("TEST_WORKSPACE") + "/" +
         path;
}

std::string ServerBinary() { return Runfile("server/precompile_server"); }

// A server process whose output is collected as it runs.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> flags) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, out[1], 2);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<std::string> args = {ServerBinary()};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    reader_ = std::thread([this, fd = out[0]] {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        output_.append(buffer, n);
      }
      close(fd);
    });
  }

  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (reader_.joinable()) reader_.join();
  }

  // Waits until the output matches `pattern`; returns the first group.
  std::string AwaitOutput(const std::string& pattern, absl::Duration timeout) {
    const std::regex re(pattern);
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        std::smatch m;
        if (std::regex_search(output_, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << "no '" << pattern << "' in the server's output:\n" << output();
    return "";
  }

  std::string output() {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }

  void Signal(int signal) { kill(pid_, signal); }

  // The exit status, or -1 if it did not exit in time.
  int Wait(absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        if (reader_.joinable()) reader_.join();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::thread reader_;
  std::mutex mu_;
  std::string output_ ABSL_GUARDED_BY(mu_);
};

// The gRPC health service liveness probes ask.
constexpr char kLive[] = "/v2/health/live";

struct Clients {
  explicit Clients(const std::string& port) {
    auto channel =
        grpc::CreateChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials());
    inference = inference::GRPCInferenceService::NewStub(channel);
    health = grpc::health::v1::Health::NewStub(channel);
  }
  // "": ready; kLive: live.
  HealthCheckResponse::ServingStatus Health(const std::string& service = "") {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status status = health->Check(&context, request, &response);
    return status.ok() ? response.status() : HealthCheckResponse::UNKNOWN;
  }
  std::unique_ptr<inference::GRPCInferenceService::Stub> inference;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
};

std::vector<std::string> Flags(const std::string& repository, int drain_timeout_seconds,
                               int shutdown_delay_seconds) {
  return {"--model_repository=" + repository,
          "--listen_address=127.0.0.1",
          "--grpc_port=0",
          "--metrics_port=-1",
          "--http_port=-1",
          "--drain_timeout_seconds=" + std::to_string(drain_timeout_seconds),
          "--shutdown_delay_seconds=" + std::to_string(shutdown_delay_seconds),
          // The slow requests here must outlast the drain, however slow the
          // machine: no limit per request unless a test sets one.
          "--max_request_seconds=0"};
}

TEST(ServerProcess, SigtermTurnsNotServingAtOnceDrainsAndExitsZero) {
  const std::string repository = testing::ExampleRepository({"loop"});
  // The slow request takes seconds, many more under a sanitizer on a busy
  // machine: the drain waits for it, however long (up to a generous bound).
  ServerProcess server(Flags(repository, 300, 1));
  const std::string port = server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60));
  ASSERT_FALSE(port.empty());
  server.AwaitOutput("event=ready", absl::Seconds(60));
  Clients clients(port);
  ASSERT_EQ(clients.Health(), HealthCheckResponse::SERVING);

  grpc::Status slow_status;
  absl::Time slow_end;
  std::thread slow([&] {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    slow_status = clients.inference->ModelInfer(&context, SlowLoopRequest(100000), &response);
    slow_end = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));
  server.Signal(SIGTERM);
  server.AwaitOutput("event=draining", absl::Seconds(5));
  const absl::Time draining = absl::Now();
  // During the shutdown delay the server still answers, and says it is going,
  // not that it is unwell.
  EXPECT_EQ(clients.Health(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(clients.Health(kLive), HealthCheckResponse::SERVING);
  grpc::ClientContext ready_context;
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(clients.inference->ServerReady(&ready_context, {}, &ready).ok());
  EXPECT_FALSE(ready.ready());

  slow.join();
  EXPECT_TRUE(slow_status.ok()) << slow_status.error_message();
  EXPECT_GT(slow_end, draining) << "the request ended before the drain began: nothing was drained";
  EXPECT_EQ(server.Wait(), 0) << server.output();
  EXPECT_THAT(server.output(), HasSubstr("event=stopped"));
}

// Calls sent while the server begins to drain, with no shutdown delay, on
// several connections: each is answered, or refused UNAVAILABLE (which
// clients retry elsewhere), never CANCELLED. gRPC's shutdown cancels the
// calls it has received that no thread has taken yet; the server first tells
// its clients to go away and waits for the calls they sent before that.
TEST(ServerProcess, CallsSentAsTheDrainBeginsAreAnsweredOrRefusedAsRetryable) {
  const std::string repository = testing::ExampleRepository({"mlp"});
  ServerProcess server(Flags(repository, 120, 0));
  const std::string port =
      server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60));
  ASSERT_FALSE(port.empty());
  server.AwaitOutput("event=ready", absl::Seconds(60));
  constexpr int kConnections = 4;
  constexpr int kCallersEach = 6;
  std::mutex mu;
  std::map<grpc::StatusCode, int> codes;
  std::string unexpected;
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  std::vector<std::thread> callers;
  for (int c = 0; c < kConnections; ++c) {
    grpc::ChannelArguments arguments;
    // Channels of different arguments do not share a connection.
    arguments.SetInt("precompile.test_connection", c);
    auto stub = std::shared_ptr<inference::GRPCInferenceService::Stub>(
        inference::GRPCInferenceService::NewStub(grpc::CreateCustomChannel(
            "127.0.0.1:" + port, grpc::InsecureChannelCredentials(), arguments)));
    for (int i = 0; i < kCallersEach; ++i) {
      callers.emplace_back([&, stub] {
        const inference::ModelInferRequest request = testing::ZerosRequest("mlp");
        // Until the server has gone: a call is then refused UNAVAILABLE.
        for (;;) {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          inference::ModelInferResponse response;
          const grpc::Status status = stub->ModelInfer(&context, request, &response);
          std::lock_guard<std::mutex> lock(mu);
          ++codes[status.error_code()];
          if (status.error_code() != grpc::StatusCode::OK &&
              status.error_code() != grpc::StatusCode::UNAVAILABLE && unexpected.empty()) {
            unexpected = absl::StrCat(status.error_code(), ": ", status.error_message());
          }
          if (status.error_code() == grpc::StatusCode::UNAVAILABLE || absl::Now() > give_up) return;
        }
      });
    }
  }
  absl::SleepFor(absl::Milliseconds(500));
  server.Signal(SIGTERM);
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(server.Wait(), 0) << server.output();
  EXPECT_EQ(unexpected, "") << "answered " << codes[grpc::StatusCode::OK] << ", unavailable "
                            << codes[grpc::StatusCode::UNAVAILABLE];
  EXPECT_EQ(codes[grpc::StatusCode::CANCELLED], 0);
  EXPECT_GT(codes[grpc::StatusCode::OK], 0);
  EXPECT_EQ(codes[grpc::StatusCode::UNAVAILABLE], kConnections * kCallersEach);
}

TEST(ServerProcess, ExitsNonZeroNamingWhatRanPastTheDrainDeadline) {
  const std::string repository = testing::ExampleRepository({"loop"});
  ServerProcess server(Flags(repository, 1, 0));
  const std::string port = server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60));
  ASSERT_FALSE(port.empty());
  server.AwaitOutput("event=ready", absl::Seconds(60));
  Clients clients(port);
  std::thread stuck([&] {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    clients.inference->ModelInfer(&context, SlowLoopRequest(5000000), &response);
  });
  absl::SleepFor(absl::Milliseconds(300));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 1) << server.output();
  EXPECT_THAT(server.output(), HasSubstr("event=drain_incomplete"));
  EXPECT_THAT(server.output(), HasSubstr("still running after the drain timeout"));
  EXPECT_THAT(server.output(), HasSubstr("loop version 1: 1"));
  stuck.join();
}

// The `loop` example's eager program loops `n` times: a client that asks for
// 10^12 iterations gets DEADLINE_EXCEEDED at the server's limit, inside the
// TorchScript loop, and the server serves the next request and drains.
TEST(ServerProcess, ARequestPastMaxRequestSecondsEndsAndTheServerStillDrainsCleanly) {
  const std::string repository = testing::ExampleRepository({"loop"});
  std::vector<std::string> flags = Flags(repository, 30, 0);
  flags.back() = "--max_request_seconds=2";
  ServerProcess server(flags);
  const std::string port = server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60));
  ASSERT_FALSE(port.empty());
  server.AwaitOutput("event=ready", absl::Seconds(60));
  Clients clients(port);

  grpc::ClientContext context;
  inference::ModelInferResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status =
      clients.inference->ModelInfer(&context, EndlessLoopRequest(), &response);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("ran past the server's limit of 2s per request (--max_request_seconds)"));
  EXPECT_GE(took, absl::Seconds(2));
  // Ended inside the loop, not after 10^12 iterations (hours).
  EXPECT_LT(took, absl::Seconds(60));

  grpc::ClientContext next_context;
  inference::ModelInferResponse next;
  grpc::Status served = clients.inference->ModelInfer(&next_context, SlowLoopRequest(1), &next);
  EXPECT_TRUE(served.ok()) << served.error_message();

  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0) << server.output();
}

TEST(ServerProcess, RefusesToStartWithoutARepository) {
  ServerProcess server(
      {"--model_repository=/nonexistent", "--grpc_port=0", "--metrics_port=-1", "--http_port=-1"});
  EXPECT_EQ(server.Wait(), 2);
  EXPECT_THAT(server.output(), HasSubstr("'/nonexistent' is not a directory"));
}

TEST(ServerProcess, RequireCompleteRefusesAnIncompleteModelAndReadinessFollowsTheFlag) {
  const std::string repository = testing::ExampleRepository({"mlp", "nested"});
  testing::MarkIncomplete(repository + "/nested/1", "wobble");
  for (bool strict : {true, false}) {
    std::vector<std::string> flags = Flags(repository, 5, 0);
    flags.push_back("--require_complete");
    flags.push_back(strict ? "--strict_readiness" : "--strict_readiness=false");
    ServerProcess server(flags);
    server.AwaitOutput("event=(not_)?ready models_ready=1 models_failed=1", absl::Seconds(60));
    EXPECT_THAT(server.output(),
                HasSubstr("event=model_load_failed model=nested version=1 reason=\"model 'nested': "
                          "the capture is incomplete (uncovered frames: [wobble], truncated by the "
                          "recompile limit) and complete artifacts are required\""));
    Clients clients(server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(5)));
    grpc::ClientContext context;
    inference::ServerReadyResponse ready;
    ASSERT_TRUE(clients.inference->ServerReady(&context, {}, &ready).ok());
    // Strict: not ready while a model of the repository is not served, and
    // live all the same (restarting would not load the model).
    EXPECT_EQ(ready.ready(), !strict) << "strict_readiness=" << strict;
    EXPECT_EQ(clients.Health(), strict ? HealthCheckResponse::NOT_SERVING
                                       : HealthCheckResponse::SERVING);
    EXPECT_EQ(clients.Health(kLive), HealthCheckResponse::SERVING);
    server.Signal(SIGTERM);
    EXPECT_EQ(server.Wait(), 0);
  }
}

TEST(ServerProcess, RefusesToStartWithATokenFileOthersCanRead) {
  const std::string token = std::string(std::getenv("TEST_TMPDIR")) + "/token";
  FILE* f = std::fopen(token.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("s3cret\n", f);
  std::fclose(f);
  chmod(token.c_str(), 0644);
  std::vector<std::string> flags = Flags(testing::ExampleRepository({"mlp"}), 5, 0);
  flags.push_back("--admin_token_file=" + token);
  ServerProcess refused(flags);
  EXPECT_EQ(refused.Wait(), 2);
  EXPECT_THAT(refused.output(), HasSubstr("event=startup_failed reason=\"admin token file " + token +
                                          ": readable by every user (mode 644)"));
  EXPECT_THAT(refused.output(), ::testing::Not(HasSubstr("s3cret")));

  // The same file readable by its owner only: the server starts, and says
  // nothing of unauthenticated control.
  chmod(token.c_str(), 0600);
  ServerProcess started(flags);
  started.AwaitOutput("event=ready", absl::Seconds(60));
  EXPECT_THAT(started.output(), ::testing::Not(HasSubstr("event=unauthenticated_control")));
  started.Signal(SIGTERM);
  EXPECT_EQ(started.Wait(), 0);
}

TEST(ServerProcess, WarnsAtStartWhenControlNeedsNoToken) {
  std::vector<std::string> flags = Flags(testing::ExampleRepository({"mlp"}), 5, 0);
  flags.push_back("--allow_unauthenticated_control");
  ServerProcess server(flags);
  server.AwaitOutput("event=ready", absl::Seconds(60));
  EXPECT_THAT(server.output(), HasSubstr("warning event=unauthenticated_control"));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ServerProcess, ThreadsDefaultToTheCoresTheProcessMayRunOn) {
  // Started from a thread pinned to one core, the server inherits that
  // affinity: its torch threads follow it, not the machine's core count.
  std::unique_ptr<ServerProcess> server;
  std::thread([&] {
    ASSERT_TRUE(testing::PinThisThreadToOneCore());
    server = std::make_unique<ServerProcess>(Flags(testing::ExampleRepository({"mlp"}), 5, 0));
  }).join();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->AwaitOutput("event=cpu usable_cores=(\\d+)", absl::Seconds(60)), "1");
  EXPECT_THAT(server->output(), HasSubstr("usable_cores=1 torch_threads=1"));
  server->AwaitOutput("event=ready", absl::Seconds(60));
  server->Signal(SIGTERM);
  EXPECT_EQ(server->Wait(), 0);
}

// tests/gate: a model whose variant calls precompile_test::gate, which holds
// every call until the test opens the gate. How many calls reach the op
// while it is closed is how many instances of the variant run at once.
int CallsAtTheGate(const std::string& gate) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(gate)) {
    n += entry.path().filename().string().rfind("entered.", 0) == 0;
  }
  return n;
}

// A repository serving tests/gate's model as version 1.
std::string GatedRepository() {
  const std::string repository = testing::NewTempDirectory("repository");
  testing::CopyTree(Runfile("tests/gate/gated"), repository + "/gated/1");
  return repository;
}

TEST(ServerProcess, RunnersPerVariantIsHowManyCallsOfOneVariantRunAtOnce) {
  const std::string repository = GatedRepository();
  // Neither 1 nor 3 is the default (2): a server that ignored the flag
  // would let 2 calls in, and fail both rounds.
  for (int runners : {1, 3}) {
    const std::string gate = testing::NewTempDirectory("gate");
    setenv("PRECOMPILE_TEST_GATE_DIR", gate.c_str(), 1);
    std::vector<std::string> flags = Flags(repository, 30, 0);
    flags.push_back("--op_library=" + Runfile("tests/gate/libgate_op.so"));
    flags.push_back("--runners_per_variant=" + std::to_string(runners));
    flags.push_back("--inference_threads=" + std::to_string(runners + 1));
    flags.push_back("--metrics_port=0");
    ServerProcess server(flags);
    unsetenv("PRECOMPILE_TEST_GATE_DIR");
    Clients clients(server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60)));
    const int metrics_port =
        std::stoi(server.AwaitOutput("event=listening .*metrics_port=(\\d+)", absl::Seconds(5)));
    auto gauge = [metrics_port](const std::string& name) {
      return testing::MetricValue(testing::HttpGet(metrics_port, "/metrics"), name);
    };
    server.AwaitOutput("event=ready", absl::Seconds(60));
    auto call_gated = [&clients] {
      const inference::ModelInferRequest request = testing::ZerosRequest("gated", {4});
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
      inference::ModelInferResponse response;
      return clients.inference->ModelInfer(&context, request, &response);
    };
    // A variant's first calls run one at a time (runtime/variant.h), as its
    // constants are set up: make one first.
    std::ofstream(gate + "/open");
    ASSERT_TRUE(call_gated().ok());
    std::filesystem::remove_all(gate);
    std::filesystem::create_directories(gate);

    // One call more than there are runners, all at once.
    std::vector<grpc::Status> statuses(runners + 1);
    std::vector<std::thread> calls;
    for (int i = 0; i <= runners; ++i) {
      calls.emplace_back([&, i] { statuses[i] = call_gated(); });
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (CallsAtTheGate(gate) < runners && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(CallsAtTheGate(gate), runners) << "runners_per_variant=" << runners;
    // The last call waits for a free instance: give it time it would use to
    // pass the gate if it could (the count above is reached without waiting).
    absl::SleepFor(absl::Seconds(1));
    EXPECT_EQ(CallsAtTheGate(gate), runners) << "runners_per_variant=" << runners;
    // What the dashboard's load panel reads: every call has a run slot, and
    // is in flight.
    EXPECT_EQ(gauge("precompile_inference_in_flight"), runners + 1);
    EXPECT_EQ(gauge("precompile_inference_queued"), 0);
    EXPECT_EQ(gauge("precompile_inference_run_slots"), runners + 1);

    std::ofstream(gate + "/open");
    for (auto& call : calls) call.join();
    for (const grpc::Status& status : statuses) EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(CallsAtTheGate(gate), runners + 1);
    EXPECT_EQ(gauge("precompile_inference_in_flight"), 0);
    server.Signal(SIGTERM);
    EXPECT_EQ(server.Wait(), 0);
  }
}

// A request held inside compiled code (the gate) can outlast every limit:
// with no request finishing for twice --max_request_seconds (at least
// 10 s), the server is neither live nor ready, so that its orchestrator
// restarts it; once a request finishes it is both again.
TEST(ServerProcess, NoRequestFinishingForTooLongTurnsLivenessRed) {
  const std::string repository = GatedRepository();
  const std::string gate = testing::NewTempDirectory("gate");
  setenv("PRECOMPILE_TEST_GATE_DIR", gate.c_str(), 1);
  std::vector<std::string> flags = Flags(repository, 30, 0);
  flags.back() = "--max_request_seconds=1";
  flags.push_back("--op_library=" + Runfile("tests/gate/libgate_op.so"));
  ServerProcess server(flags);
  unsetenv("PRECOMPILE_TEST_GATE_DIR");
  Clients clients(server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60)));
  server.AwaitOutput("event=ready", absl::Seconds(60));
  auto live = [&clients] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    inference::ServerLiveResponse response;
    return clients.inference->ServerLive(&context, {}, &response).ok() && response.live();
  };
  ASSERT_TRUE(live());

  grpc::Status held;
  std::thread call([&] {
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    held = clients.inference->ModelInfer(&context, testing::ZerosRequest("gated", {4}), &response);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (CallsAtTheGate(gate) < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(CallsAtTheGate(gate), 1);
  server.AwaitOutput("event=stalled in_flight_requests=1", absl::Seconds(30));
  EXPECT_FALSE(live());
  EXPECT_EQ(clients.Health(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(clients.Health(kLive), HealthCheckResponse::NOT_SERVING);

  std::ofstream(gate + "/open");
  call.join();
  server.AwaitOutput("event=progress_resumed", absl::Seconds(10));
  EXPECT_TRUE(live());
  EXPECT_EQ(clients.Health(), HealthCheckResponse::SERVING);
  EXPECT_EQ(clients.Health(kLive), HealthCheckResponse::SERVING);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0) << server.output();
}

// HTTP and gRPC requests are admitted by one scheduler: with the limit
// taken by gRPC calls held at the gate, an HTTP request is refused (429),
// and answered once they are through.
TEST(ServerProcess, HttpAndGrpcRequestsShareOneLimitOfConcurrentRequests) {
  const std::string repository = GatedRepository();
  const std::string gate = testing::NewTempDirectory("gate");
  setenv("PRECOMPILE_TEST_GATE_DIR", gate.c_str(), 1);
  std::vector<std::string> flags = Flags(repository, 30, 0);
  for (const char* flag : {"--http_port=0", "--max_concurrent_requests=2",
                           "--inference_threads=2", "--runners_per_variant=2"}) {
    flags.push_back(flag);
  }
  flags.push_back("--op_library=" + Runfile("tests/gate/libgate_op.so"));
  ServerProcess server(flags);
  unsetenv("PRECOMPILE_TEST_GATE_DIR");
  Clients clients(server.AwaitOutput("event=listening grpc_port=(\\d+)", absl::Seconds(60)));
  const int http_port =
      std::stoi(server.AwaitOutput("event=listening .*http_port=(\\d+)", absl::Seconds(5)));
  server.AwaitOutput("event=ready", absl::Seconds(60));
  httplib::Client http("127.0.0.1", http_port);
  http.set_read_timeout(90, 0);
  const std::string body =
      R"({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0]}]})";
  auto call_grpc = [&clients] {
    const inference::ModelInferRequest request = testing::ZerosRequest("gated", {4});
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
    inference::ModelInferResponse response;
    return clients.inference->ModelInfer(&context, request, &response);
  };
  std::ofstream(gate + "/open");  // The first call sets up constants; see above.
  ASSERT_TRUE(call_grpc().ok());
  std::filesystem::remove_all(gate);
  std::filesystem::create_directories(gate);

  std::vector<grpc::Status> statuses(2);
  std::vector<std::thread> calls;
  for (int i = 0; i < 2; ++i) calls.emplace_back([&, i] { statuses[i] = call_grpc(); });
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (CallsAtTheGate(gate) < 2 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(CallsAtTheGate(gate), 2);
  httplib::Result refused = http.Post("/v2/models/gated/infer", body, "application/json");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 429);
  EXPECT_THAT(refused->body, HasSubstr("at its limit of 2 concurrent inference requests"));

  std::ofstream(gate + "/open");
  for (auto& call : calls) call.join();
  for (const grpc::Status& status : statuses) EXPECT_TRUE(status.ok()) << status.error_message();
  httplib::Result served = http.Post("/v2/models/gated/infer", body, "application/json");
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200) << served->body;
  EXPECT_THAT(served->body, HasSubstr(R"("precompile_outcome":"variant")"));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ServerProcess, AModelCallingAnOperatorNoLibraryRegisteredFailsToLoadNamingIt) {
  const std::string repository = GatedRepository();
  ServerProcess server(Flags(repository, 5, 0));
  const std::string reason =
      server.AwaitOutput("event=model_load_failed model=gated version=1 reason=\"([^\n]*)",
                         absl::Seconds(60));
  EXPECT_THAT(reason, HasSubstr("precompile_test::gate"));
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ServerProcess, RefusesToStartWithAnOpLibraryItCannotLoad) {
  std::vector<std::string> flags = Flags(testing::ExampleRepository({"mlp"}), 5, 0);
  flags.push_back("--op_library=/nonexistent/libops.so");
  ServerProcess server(flags);
  EXPECT_EQ(server.Wait(), 2);
  EXPECT_THAT(server.output(), HasSubstr("--op_library: /nonexistent/libops.so"));
}

}  // namespace
}  // namespace precompile
