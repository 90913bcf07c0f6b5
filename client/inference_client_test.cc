// InferenceClient and AdminClient against the real server on loopback: the
// reference calls of the example models, asynchronous calls, deadlines,
// gRPC's retries on UNAVAILABLE (and none on a refusal, nor of the calls
// that change the server), mutual TLS and the admin token.
#include "client/inference_client.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/infer_request.h"
#include "client/retry.h"
#include "tests/testing/test_server.h"

namespace precompile::client {
namespace {

using testing::AddressOf;
using testing::CompareFloats;
using testing::FloatsOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReferenceInputs;
using testing::ReferenceOutput;
using testing::ReferenceScalars;

inference::ModelInferRequest ReferenceRequest(const std::string& model, const std::string& call) {
  absl::StatusOr<inference::ModelInferRequest> request =
      MakeInferRequest(model, ReferenceInputs(model, call), ReferenceScalars(model, call));
  EXPECT_TRUE(request.ok()) << request.status();
  return *request;
}

// Checks a response against the reference call's Python output.
void ExpectReferenceOutput(const absl::StatusOr<inference::ModelInferResponse>& response,
                           const std::string& model, const std::string& call) {
  ASSERT_TRUE(response.ok()) << model << "/" << call << ": " << response.status();
  absl::StatusOr<InferResult> result = ReadInferResponse(*response);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->outputs.size(), 1u);
  EXPECT_EQ(result->outputs[0].name, "output0");
  EXPECT_EQ(result->outputs[0].shape, testing::ReferenceOutputShape(model, call));
  EXPECT_EQ(CompareFloats(FloatsOf(result->outputs[0]), ReferenceOutput(model, call)), "")
      << model << "/" << call;
}

// A loopback port bound by no listener: connecting to it is refused. Held
// until Release() so that nothing else takes it meanwhile.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t size = sizeof(address);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size);
    port_ = ntohs(address.sin_port);
  }
  ~RefusingPort() { Release(); }
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

ClientOptions FastRetries(const std::string& address, int attempts) {
  ClientOptions options;
  options.address = address;
  options.timeout = absl::Seconds(20);
  options.retry.max_attempts = attempts;
  options.retry.initial_backoff = absl::Milliseconds(50);
  options.retry.max_backoff = absl::Milliseconds(200);
  return options;
}

class InferenceClientTest : public testing::ExampleServerTest {
 protected:
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    options_.address = AddressOf(*server_);
    options_.async_threads = 2;
    client_ = *InferenceClient::Create(options_);
    admin_ = *AdminClient::Create(options_);
  }

  uint64_t FailedInferences(const std::string& model) {
    auto stats = client_->ModelStatistics(model);
    EXPECT_TRUE(stats.ok()) << stats.status();
    if (!stats.ok() || stats->model_stats_size() != 1) return 0;
    return stats->model_stats(0).inference_stats().fail().count();
  }

  ClientOptions options_;
  std::unique_ptr<InferenceClient> client_;
  std::unique_ptr<AdminClient> admin_;
};

TEST_F(InferenceClientTest, ServesAReferenceCallAndSaysItRanAVariant) {
  absl::StatusOr<inference::ModelInferResponse> response =
      client_->Infer(ReferenceRequest("mlp", "batch8"));
  ExpectReferenceOutput(response, "mlp", "batch8");
  absl::StatusOr<InferResult> result = ReadInferResponse(*response);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outcome, "variant");
  EXPECT_EQ(result->variant, "forward#0");
  EXPECT_EQ(result->model_version, "1");

  ExpectReferenceOutput(client_->Infer(ReferenceRequest("mlp", "batch16")), "mlp", "batch16");
}

TEST_F(InferenceClientTest, SaysWhenTheEntryFrameRanEagerly) {
  absl::StatusOr<inference::ModelInferResponse> response =
      client_->Infer(ReferenceRequest("loop", "n3"));
  ExpectReferenceOutput(response, "loop", "n3");
  EXPECT_EQ(PrecompileParameter(*response, "precompile_outcome"), "eager_fallback");
  EXPECT_EQ(PrecompileParameter(*response, "precompile_variant"), "");
}

TEST_F(InferenceClientTest, ARefusalIsFailedPreconditionAndIsNotRetried) {
  const uint64_t failed_before = FailedInferences("mlp");
  absl::StatusOr<inference::ModelInferResponse> response =
      client_->Infer(ReferenceRequest("mlp", "batch1"), {.max_attempts = 5});
  EXPECT_EQ(response.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(response.status().message(),
              HasSubstr("no captured variant matches this call of frame 'forward'"));
  EXPECT_THAT(response.status().message(), Not(HasSubstr("attempts")));
  // The server saw exactly one attempt.
  EXPECT_EQ(FailedInferences("mlp"), failed_before + 1);

  inference::ModelInferRequest unknown = ReferenceRequest("mlp", "batch8");
  unknown.set_model_name("nope");
  EXPECT_EQ(client_->Infer(unknown, {.max_attempts = 5}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(InferenceClientTest, RefusesToBuildInconsistentRequests) {
  std::vector<Tensor> inputs = ReferenceInputs("mlp", "batch8");
  inputs[0].shape = {9, 4};
  EXPECT_THAT(MakeInferRequest("mlp", inputs).status().message(),
              HasSubstr("has 128 bytes but shape [9, 4] of FP32 needs 144"));
  inputs = ReferenceInputs("mlp", "batch8");
  inputs.push_back(inputs[0]);
  EXPECT_THAT(MakeInferRequest("mlp", inputs).status().message(),
              HasSubstr("input 'x' is given more than once"));
  inputs.pop_back();
  inputs[0].datatype = "FP8";
  EXPECT_EQ(MakeInferRequest("mlp", inputs).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(InferenceClientTest, ReadsOutputsSentAsTypedContents) {
  inference::ModelInferResponse response;
  auto* output = response.add_outputs();
  output->set_name("output0");
  output->set_datatype("INT16");
  output->add_shape(3);
  for (int v : {-2, 0, 7}) output->mutable_contents()->add_int_contents(v);
  absl::StatusOr<InferResult> result = ReadInferResponse(response);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->outputs.size(), 1u);
  EXPECT_EQ(result->outputs[0].data.size(), 6u);
  EXPECT_EQ(ElementAsInt64(result->outputs[0], 0), -2);
  EXPECT_EQ(ElementAsInt64(result->outputs[0], 2), 7);
  EXPECT_EQ(result->outcome, "");
}

class AsyncInferTest : public InferenceClientTest, public ::testing::WithParamInterface<int> {};

TEST_P(AsyncInferTest, CompletesManyConcurrentCalls) {
  ClientOptions options = options_;
  options.async_threads = GetParam();
  auto client = *InferenceClient::Create(options);
  const std::vector<std::string> calls = {"batch8", "batch16", "batch5"};
  std::vector<std::shared_ptr<const inference::ModelInferRequest>> requests;
  for (const auto& call : calls) {
    requests.push_back(
        std::make_shared<const inference::ModelInferRequest>(ReferenceRequest("mlp", call)));
  }
  constexpr int kCalls = 60;
  std::mutex mu;
  std::condition_variable all_done;
  int done = 0;
  std::vector<std::string> failures;
  for (int i = 0; i < kCalls; ++i) {
    const std::string call = calls[i % calls.size()];
    client->InferAsync(requests[i % calls.size()], {},
                       [&, call](absl::StatusOr<inference::ModelInferResponse> response) {
                         std::string failure;
                         if (!response.ok()) {
                           failure = std::string(response.status().message());
                         } else {
                           auto result = ReadInferResponse(*response);
                           failure = result.ok() ? CompareFloats(FloatsOf(result->outputs[0]),
                                                                 ReferenceOutput("mlp", call))
                                                 : std::string(result.status().message());
                         }
                         std::lock_guard<std::mutex> lock(mu);
                         ++done;
                         if (!failure.empty()) failures.push_back(call + ": " + failure);
                         all_done.notify_all();
                       });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(all_done.wait_for(lock, std::chrono::seconds(30), [&] { return done == kCalls; }));
  }
  EXPECT_TRUE(failures.empty()) << failures.front();

  auto future = client->InferFuture(ReferenceRequest("loop", "n1"));
  ExpectReferenceOutput(future.get(), "loop", "n1");
}

INSTANTIATE_TEST_SUITE_P(Threads, AsyncInferTest, ::testing::Values(1, 4));

TEST_F(InferenceClientTest, EnforcesTheDeadline) {
  // n iterations of an eager loop: far longer than the deadline.
  inference::ModelInferRequest slow = ReferenceRequest("loop", "n1");
  (*slow.mutable_parameters())["n"].set_int64_param(30000);
  const absl::Time start = absl::Now();
  absl::StatusOr<inference::ModelInferResponse> response =
      client_->Infer(slow, {.timeout = absl::Milliseconds(20)});
  EXPECT_EQ(response.status().code(), absl::StatusCode::kDeadlineExceeded) << response.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));

  auto future = client_->InferFuture(slow, {.timeout = absl::Milliseconds(20)});
  absl::Status async_status = future.get().status();
  EXPECT_EQ(async_status.code(), absl::StatusCode::kDeadlineExceeded) << async_status;
}

TEST(RetryTest, GivesUpOnARefusingPortAfterTheConfiguredAttempts) {
  RefusingPort port;
  auto client = *InferenceClient::Create(FastRetries(port.address(), 3));
  absl::Time start = absl::Now();
  absl::StatusOr<bool> live = client->ServerLive();
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(live.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(live.status().message(), HasSubstr("(after up to 3 attempts)"));
  // Two backoffs of 50 and 100 ms, each jittered by at most 20%.
  EXPECT_GE(elapsed, absl::Milliseconds(120));

  inference::ModelInferRequest request;
  request.set_model_name("mlp");
  auto future = client->InferFuture(request);
  absl::StatusOr<inference::ModelInferResponse> response = future.get();
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(response.status().message(), HasSubstr("(after up to 3 attempts)"));

  // Another count for one call: 50, 100, 200 and 200 ms.
  start = absl::Now();
  live = client->ServerLive({.max_attempts = 5});
  elapsed = absl::Now() - start;
  EXPECT_THAT(live.status().message(), HasSubstr("(after up to 5 attempts)"));
  EXPECT_GE(elapsed, absl::Milliseconds(440));
  response = client->InferFuture(request, {.max_attempts = 5}).get();
  EXPECT_THAT(response.status().message(), HasSubstr("(after up to 5 attempts)"));

  absl::StatusOr<bool> once = client->ServerLive({.max_attempts = 1});
  EXPECT_EQ(once.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(once.status().message(), Not(HasSubstr("attempts")));
  EXPECT_EQ(client->ServerLive({.max_attempts = 6}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RetryTest, NeverRetriesWhatChangesTheServer) {
  RefusingPort port;
  // Retries would take 0.8 + 1.6 s at least.
  ClientOptions options = FastRetries(port.address(), 3);
  options.retry.initial_backoff = absl::Seconds(1);
  options.retry.max_backoff = absl::Seconds(2);
  // One channel: a second one would wait for the first one's reconnect
  // backoff (they share the connection) before failing its first call.
  std::shared_ptr<grpc::Channel> channel = *CreateChannel(options);
  auto client = *InferenceClient::Create(options, channel);
  auto admin = *AdminClient::Create(options, channel);
  const absl::Time start = absl::Now();
  absl::Status load = client->RepositoryModelLoad("mlp");
  EXPECT_EQ(load.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(load.message(), Not(HasSubstr("attempts")));
  EXPECT_EQ(client->RepositoryModelUnload("mlp").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admin->LoadModel("mlp").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admin->UnloadModel("mlp").status().code(), absl::StatusCode::kUnavailable);
  absl::StatusOr<precompile::v1::RescanResponse> rescan = admin->Rescan({.max_attempts = 5});
  EXPECT_EQ(rescan.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(rescan.status().message(), Not(HasSubstr("attempts")));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(800));

  // A reading admin call is retried.
  EXPECT_THAT(admin->ListModels().status().message(), HasSubstr("(after up to 3 attempts)"));
}

TEST(RetryTest, StopsRetryingAtTheDeadline) {
  RefusingPort port;
  ClientOptions options = FastRetries(port.address(), 5);
  options.retry.initial_backoff = absl::Milliseconds(300);
  auto client = *InferenceClient::Create(options);
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> live = client->ServerLive({.timeout = absl::Milliseconds(400)});
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500));
  EXPECT_EQ(live.status().code(), absl::StatusCode::kDeadlineExceeded) << live.status();
}

TEST(RetryTest, ReachesAServerThatStartsWhileRetrying) {
  RefusingPort port;
  // Attempts at about 0, 1, 3, 7 and 11 s; gRPC reconnects on a schedule of
  // its own in between (1, 2.6, 5.2 s, ...), so the last attempts leave it
  // time to find the server up.
  ClientOptions options = FastRetries(port.address(), 5);
  options.retry.initial_backoff = absl::Seconds(1);
  options.retry.max_backoff = absl::Seconds(4);
  auto client = *InferenceClient::Create(options);
  std::unique_ptr<server::Server> server;
  std::thread starter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    port.Release();
    server = testing::StartExampleServer([&](server::ServerOptions& options) {
      options.grpc_address = "127.0.0.1:" + std::to_string(port.port());
    });
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> live = client->ServerLive();
  EXPECT_TRUE(live.ok()) << live.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  starter.join();
}

TEST(RetryTest, RetriesOnlyWhatChangesNothing) {
  const std::string config = *RetryServiceConfig(RetryPolicy());
  EXPECT_THAT(config,
              HasSubstr(R"({"method":"ModelInfer","service":"inference.GRPCInferenceService"})"));
  EXPECT_THAT(config, HasSubstr(R"({"method":"Check","service":"grpc.health.v1.Health"})"));
  EXPECT_THAT(config,
              HasSubstr(R"({"method":"GetSummary","service":"precompile.v1.PrecompileAdmin"})"));
  for (const char* method :
       {"RepositoryModelLoad", "RepositoryModelUnload", "LoadModel", "UnloadModel", "Rescan"}) {
    EXPECT_THAT(config, Not(HasSubstr(absl::StrCat("\"", method, "\""))));
  }
  EXPECT_THAT(config,
              HasSubstr(R"("retryPolicy":{"backoffMultiplier":2.0,)"
                        R"("initialBackoff":"0.100s","maxAttempts":3,"maxBackoff":"2.000s",)"
                        R"("retryableStatusCodes":["UNAVAILABLE"]})"));
  RetryPolicy once;
  once.max_attempts = 1;
  EXPECT_EQ(*RetryServiceConfig(once), "{}");
  for (int attempts : {0, 6}) {
    RetryPolicy bad;
    bad.max_attempts = attempts;
    EXPECT_EQ(RetryServiceConfig(bad).status().code(), absl::StatusCode::kInvalidArgument);
    ClientOptions options;
    options.retry = bad;
    EXPECT_THAT(CreateChannel(options).status().message(), HasSubstr("from 1 to 5"));
  }
}

TEST_F(InferenceClientTest, AdminCallsReportTheArtifact) {
  auto summary = admin_->GetSummary("loop");
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->entry_frame(), "forward");
  EXPECT_TRUE(summary->complete());
  EXPECT_THAT(summary->eager_fallbacks(), ::testing::ElementsAre(HasSubstr("forward")));

  auto frames = admin_->GetFrames("loop");
  ASSERT_TRUE(frames.ok());
  EXPECT_THAT(frames->frames(), HasSubstr("# eager fallback"));

  ASSERT_TRUE(client_->Infer(ReferenceRequest("loop", "n1")).ok());
  auto coverage = admin_->GetCoverage("loop");
  ASSERT_TRUE(coverage.ok());
  ASSERT_EQ(coverage->frames_size(), 1);
  EXPECT_GE(coverage->frames(0).eager_fallback_calls(), 1u);
  auto warnings = admin_->ListWarnings("loop");
  ASSERT_TRUE(warnings.ok());
  ASSERT_EQ(warnings->warnings_size(), 1);
  EXPECT_EQ(warnings->warnings(0).frame(), "forward");

  auto models = admin_->ListModels();
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->models_size(), 2);

  EXPECT_EQ(admin_->GetSummary("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(InferenceClientTest, UnloadsAndLoadsAModel) {
  auto unloaded = admin_->UnloadModel("mlp");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  EXPECT_EQ(unloaded->status().state(), precompile::v1::ModelStatus::UNAVAILABLE);
  EXPECT_FALSE(*client_->ModelReady("mlp"));
  EXPECT_EQ(client_->Infer(ReferenceRequest("mlp", "batch8")).status().code(),
            absl::StatusCode::kNotFound);
  auto loaded = admin_->LoadModel("mlp");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->status().state(), precompile::v1::ModelStatus::READY);
  EXPECT_TRUE(*client_->ModelReady("mlp"));
  ExpectReferenceOutput(client_->Infer(ReferenceRequest("mlp", "batch8")), "mlp", "batch8");

  EXPECT_TRUE(client_->RepositoryModelLoad("loop").ok());
  auto rescanned = admin_->Rescan();
  ASSERT_TRUE(rescanned.ok());
  EXPECT_EQ(rescanned->models_size(), 2);
}

TEST(TlsTest, MutualTlsWithTheAdminToken) {
  const std::string token = "s3cret-token";
  std::unique_ptr<server::Server> server =
      testing::StartExampleServer([&](server::ServerOptions& options) {
        options.tls_cert_file = testing::TestCertificate("server.pem");
        options.tls_key_file = testing::TestCertificate("server.key");
        options.tls_client_ca_file = testing::TestCertificate("ca.pem");
        options.admin_token = token;
      });
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.address = AddressOf(*server);
  options.retry.max_attempts = 1;
  options.timeout = absl::Seconds(10);
  options.tls.root_ca_file = testing::TestCertificate("ca.pem");
  options.tls.client_cert_file = testing::TestCertificate("client.pem");
  options.tls.client_key_file = testing::TestCertificate("client.key");
  options.tls.server_name_override = "precompile.test";

  auto client = *InferenceClient::Create(options);
  ExpectReferenceOutput(client->Infer(ReferenceRequest("mlp", "batch8")), "mlp", "batch8");
  // Without the token: inference works, admin calls do not.
  auto admin = *AdminClient::Create(options);
  auto summary = admin->GetSummary("mlp");
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(client->RepositoryModelLoad("mlp").code(), absl::StatusCode::kUnauthenticated);
  ClientOptions with_token = options;
  with_token.admin_token = token;
  EXPECT_TRUE((*AdminClient::Create(with_token))->GetSummary("mlp").ok());
  EXPECT_TRUE((*InferenceClient::Create(with_token))->RepositoryModelLoad("mlp").ok());
  with_token.admin_token = "wrong";
  EXPECT_EQ((*AdminClient::Create(with_token))->GetSummary("mlp").status().code(),
            absl::StatusCode::kUnauthenticated);

  // Handshakes that must fail: no client certificate, a server name the
  // certificate does not carry, plaintext.
  ClientOptions no_cert = options;
  no_cert.tls.client_cert_file.clear();
  no_cert.tls.client_key_file.clear();
  EXPECT_EQ((*InferenceClient::Create(no_cert))->ServerLive().status().code(),
            absl::StatusCode::kUnavailable);
  ClientOptions wrong_name = options;
  wrong_name.tls.server_name_override.clear();
  EXPECT_EQ((*InferenceClient::Create(wrong_name))->ServerLive().status().code(),
            absl::StatusCode::kUnavailable);
  ClientOptions plaintext;
  plaintext.address = options.address;
  plaintext.retry.max_attempts = 1;
  EXPECT_EQ((*InferenceClient::Create(plaintext))->ServerLive().status().code(),
            absl::StatusCode::kUnavailable);

  ClientOptions half = options;
  half.tls.client_key_file.clear();
  EXPECT_EQ(InferenceClient::Create(half).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace precompile::client
