// The model repository under a running server: new versions replace old ones
// without failing requests in flight, a version policy serves several
// versions that requests choose by number, broken models are reported and do not
// stop the others, requests beyond the inference threads wait their turn
// while other calls still answer, and the concurrency limit answers
// RESOURCE_EXHAUSTED.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/admin.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/http.h"
#include "tests/testing/requests.h"

namespace precompile {
namespace {

namespace fs = std::filesystem;
using ::precompile::testing::CopyTree;
using ::precompile::testing::EndlessLoopRequest;
using ::precompile::testing::ExampleArtifact;
using ::precompile::testing::ExampleRepository;
using ::precompile::testing::HttpGet;
using ::precompile::testing::MetricValue;
using ::precompile::testing::SlowLoopRequest;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

inference::ModelInferRequest MlpRequest() { return testing::ZerosRequest("mlp"); }

class Harness {
 public:
  explicit Harness(const std::string& repository, int max_concurrent_requests = 128,
                   absl::Duration poll_interval = absl::ZeroDuration(),
                   int inference_threads = 0) {
    server::ServerOptions options;
    options.model_repository = repository;
    options.repository_poll_interval = poll_interval;
    options.grpc_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.max_concurrent_requests = max_concurrent_requests;
    options.inference_threads = inference_threads;
    // These tests load, unload and rescan without a token; the default, which
    // refuses that, is ControlIsRefusedWithoutATokenAndChangesNothing.
    options.allow_unauthenticated_control = true;
    auto started = server::Server::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->grpc_port()),
                                  grpc::InsecureChannelCredentials());
    inference = inference::GRPCInferenceService::NewStub(channel);
    admin = precompile::v1::PrecompileAdmin::NewStub(channel);
  }

  grpc::Status Infer(const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    return inference->ModelInfer(&context, request, response);
  }

  std::map<std::string, inference::RepositoryIndexResponse::ModelIndex> Index() {
    grpc::ClientContext context;
    inference::RepositoryIndexResponse index;
    EXPECT_TRUE(inference->RepositoryIndex(&context, {}, &index).ok());
    std::map<std::string, inference::RepositoryIndexResponse::ModelIndex> by_name;
    // A model with several versions served is listed once per version,
    // newest first: keep the newest.
    for (const auto& m : index.models()) by_name.emplace(m.name(), m);
    return by_name;
  }

  void Rescan() {
    grpc::ClientContext context;
    precompile::v1::RescanResponse response;
    ASSERT_TRUE(admin->Rescan(&context, {}, &response).ok());
  }

  std::unique_ptr<server::Server> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<inference::GRPCInferenceService::Stub> inference;
  std::unique_ptr<precompile::v1::PrecompileAdmin::Stub> admin;
};

// Sends `request` from a new thread under `context`, which the test may
// cancel: `*status` is its result once the thread is joined; `*done`, if
// given, turns true as soon as it returns.
std::thread InferInBackground(Harness& harness, grpc::ClientContext* context,
                              inference::ModelInferRequest request, grpc::Status* status,
                              std::atomic<bool>* done = nullptr) {
  return std::thread([&harness, context, request = std::move(request), status, done] {
    inference::ModelInferResponse response;
    *status = harness.inference->ModelInfer(context, request, &response);
    if (done) *done = true;
  });
}

// Clients that call `mlp` in a loop and count what they get back.
class Load {
 public:
  Load(Harness& harness, int threads) {
    for (int t = 0; t < threads; ++t) {
      workers_.emplace_back([this, &harness] {
        const inference::ModelInferRequest request = MlpRequest();
        while (!stop_) {
          inference::ModelInferResponse response;
          grpc::Status status = harness.Infer(request, &response);
          std::lock_guard<std::mutex> lock(mu_);
          if (status.ok()) {
            ++versions_[response.model_version()];
          } else {
            ++errors_[status.error_code()];
            last_error_ = status.error_message();
          }
        }
      });
    }
  }
  void Stop() {
    stop_ = true;
    for (auto& w : workers_) w.join();
    workers_.clear();
  }
  ~Load() { Stop(); }

  std::mutex mu_;
  std::map<std::string, int> versions_;
  std::map<grpc::StatusCode, int> errors_;
  std::string last_error_;

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

TEST(ServerRepository, ANewVersionReplacesTheOldWithoutFailingARequest) {
  const std::string repository = ExampleRepository({"mlp"});
  Harness harness(repository);
  Load load(harness, 4);
  absl::SleepFor(absl::Milliseconds(300));

  CopyTree(ExampleArtifact("mlp"), repository + "/mlp/2");
  harness.Rescan();
  EXPECT_EQ(harness.Index()["mlp"].version(), "2");
  absl::SleepFor(absl::Milliseconds(300));
  load.Stop();

  EXPECT_TRUE(load.errors_.empty()) << "first error: " << load.last_error_;
  EXPECT_GT(load.versions_["1"], 0);
  EXPECT_GT(load.versions_["2"], 0);
  // Version 1's series went with it.
  const std::string metrics = HttpGet(harness.server->metrics_port(), "/metrics");
  EXPECT_GT(MetricValue(metrics, "precompile_requests_total{model=\"mlp\",outcome=\"variant\","
                                 "version=\"2\"}"),
            0);
  EXPECT_EQ(MetricValue(metrics, "precompile_requests_total{model=\"mlp\",outcome=\"variant\","
                                 "version=\"1\"}"),
            -1);
}

// The version each of `versions` is answered by ("" for none asked), or the
// error's code and message.
std::vector<std::string> AnsweredBy(Harness& harness, const std::vector<std::string>& versions) {
  std::vector<std::string> answers;
  for (const std::string& version : versions) {
    inference::ModelInferRequest request = MlpRequest();
    request.set_model_version(version);
    inference::ModelInferResponse response;
    const grpc::Status status = harness.Infer(request, &response);
    answers.push_back(status.ok() ? response.model_version()
                                  : absl::StrCat(status.error_code(), ": ", status.error_message()));
  }
  return answers;
}

TEST(ServerRepository, AVersionPolicyServesSeveralVersionsThatRequestsChooseByNumber) {
  const std::string repository = ExampleRepository({"mlp"});
  CopyTree(ExampleArtifact("mlp"), repository + "/mlp/2");
  std::ofstream(repository + "/mlp/config.pbtxt")
      << "name: \"mlp\"\nversion_policy: { latest: { num_versions: 2 } }\n";
  Harness harness(repository);

  EXPECT_THAT(AnsweredBy(harness, {"1", "2", "", "2"}), ElementsAre("1", "2", "2", "2"));
  EXPECT_THAT(AnsweredBy(harness, {"3"}),
              ElementsAre(absl::StrCat(grpc::StatusCode::NOT_FOUND,
                                       ": version '3' of model 'mlp' is not served (serving "
                                       "versions 2, 1)")));
  {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name("mlp");
    inference::ModelMetadataResponse metadata;
    ASSERT_TRUE(harness.inference->ModelMetadata(&context, request, &metadata).ok());
    EXPECT_THAT(metadata.versions(), ElementsAre("2", "1"));
  }
  {
    grpc::ClientContext context;
    inference::ModelConfigRequest request;
    request.set_name("mlp");
    inference::ModelConfigResponse config;
    ASSERT_TRUE(harness.inference->ModelConfig(&context, request, &config).ok());
    EXPECT_EQ(config.config().version_policy().latest().num_versions(), 2u);
  }
  for (const auto& [version, ready] :
       std::vector<std::pair<std::string, bool>>{{"1", true}, {"2", true}, {"3", false}}) {
    grpc::ClientContext context;
    inference::ModelReadyRequest request;
    request.set_name("mlp");
    request.set_version(version);
    inference::ModelReadyResponse response;
    ASSERT_TRUE(harness.inference->ModelReady(&context, request, &response).ok());
    EXPECT_EQ(response.ready(), ready) << "version " << version;
  }
  {
    grpc::ClientContext context;
    inference::RepositoryIndexResponse index;
    ASSERT_TRUE(harness.inference->RepositoryIndex(&context, {}, &index).ok());
    std::vector<std::string> listed;
    for (const auto& m : index.models()) listed.push_back(m.name() + "/" + m.version());
    EXPECT_THAT(listed, ElementsAre("mlp/2", "mlp/1"));
  }
  {
    // Each version counts its own requests: one for 1, three for 2.
    grpc::ClientContext context;
    inference::ModelStatisticsRequest request;
    request.set_name("mlp");
    inference::ModelStatisticsResponse stats;
    ASSERT_TRUE(harness.inference->ModelStatistics(&context, request, &stats).ok());
    std::vector<std::string> counts;
    for (const auto& m : stats.model_stats()) {
      counts.push_back(absl::StrCat(m.version(), ":", m.inference_count()));
    }
    EXPECT_THAT(counts, ElementsAre("2:3", "1:1"));
  }

  // Back to the newest only: version 1 is retired, 2 keeps serving as loaded.
  std::ofstream(repository + "/mlp/config.pbtxt")
      << "version_policy: { latest: { num_versions: 1 } }\n";
  harness.Rescan();
  EXPECT_THAT(AnsweredBy(harness, {"2", "1"}),
              ElementsAre("2", absl::StrCat(grpc::StatusCode::NOT_FOUND,
                                            ": version '1' of model 'mlp' is not served "
                                            "(serving version 2)")));
}

TEST(ServerRepository, PollingPicksUpNewModelsAndVersions) {
  const std::string repository = ExampleRepository({"mlp"});
  Harness harness(repository, 128, absl::Milliseconds(100));
  CopyTree(ExampleArtifact("mlp"), repository + "/mlp/2");
  CopyTree(ExampleArtifact("loop"), repository + "/loop/1");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && (harness.Index()["mlp"].version() != "2" ||
                                    harness.Index()["loop"].state() != "READY")) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(harness.Index()["mlp"].version(), "2");
  EXPECT_EQ(harness.Index()["loop"].state(), "READY");
  // A model whose directory goes away is unloaded.
  fs::remove_all(repository + "/loop");
  while (absl::Now() < deadline && harness.Index()["loop"].state() == "READY") {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(harness.Index()["loop"].state(), "UNAVAILABLE");
  EXPECT_THAT(harness.Index()["loop"].reason(), HasSubstr("directory was removed"));
}

TEST(ServerRepository, UnloadingUnderLoadFailsOnlyLaterRequestsWithNotFound) {
  const std::string repository = ExampleRepository({"mlp"});
  Harness harness(repository);
  Load load(harness, 4);
  absl::SleepFor(absl::Milliseconds(200));
  grpc::ClientContext context;
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("mlp");
  inference::RepositoryModelUnloadResponse unloaded;
  ASSERT_TRUE(harness.inference->RepositoryModelUnload(&context, unload, &unloaded).ok());
  absl::SleepFor(absl::Milliseconds(200));
  load.Stop();
  for (const auto& [code, count] : load.errors_) {
    EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND) << count << " calls failed: " << load.last_error_;
  }
  EXPECT_THAT(load.last_error_, HasSubstr("model 'mlp' is unloaded"));
  EXPECT_EQ(harness.Index()["mlp"].state(), "UNAVAILABLE");
  // A rescan leaves a model unloaded on request alone; a load brings it back.
  harness.Rescan();
  EXPECT_EQ(harness.Index()["mlp"].state(), "UNAVAILABLE");
  grpc::ClientContext load_context;
  inference::RepositoryModelLoadRequest load_request;
  load_request.set_model_name("mlp");
  inference::RepositoryModelLoadResponse load_response;
  ASSERT_TRUE(harness.inference->RepositoryModelLoad(&load_context, load_request, &load_response)
                  .ok());
  inference::ModelInferResponse response;
  EXPECT_TRUE(harness.Infer(MlpRequest(), &response).ok());
}

TEST(ServerRepository, EveryThreadSeesAnUnloadAndALoadAtOnce) {
  const std::string repository = ExampleRepository({"mlp"});
  Harness harness(repository);
  // Requests from 8 clients at once, so that every inference thread answers
  // some (each keeps its own copy of the repository's answers).
  auto infer_from_8_clients = [&harness](std::map<int, int>* codes) {
    std::mutex mu;
    std::vector<std::thread> clients;
    for (int c = 0; c < 8; ++c) {
      clients.emplace_back([&] {
        for (int i = 0; i < 8; ++i) {
          inference::ModelInferResponse response;
          const grpc::Status status = harness.Infer(MlpRequest(), &response);
          std::lock_guard<std::mutex> lock(mu);
          ++(*codes)[status.error_code()];
        }
      });
    }
    for (std::thread& t : clients) t.join();
  };
  std::map<int, int> before, unloaded, reloaded;
  infer_from_8_clients(&before);
  EXPECT_EQ(before, (std::map<int, int>{{grpc::StatusCode::OK, 64}}));

  grpc::ClientContext unload_context;
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("mlp");
  inference::RepositoryModelUnloadResponse unload_response;
  ASSERT_TRUE(
      harness.inference->RepositoryModelUnload(&unload_context, unload, &unload_response).ok());
  infer_from_8_clients(&unloaded);
  EXPECT_EQ(unloaded, (std::map<int, int>{{grpc::StatusCode::NOT_FOUND, 64}}));

  grpc::ClientContext load_context;
  inference::RepositoryModelLoadRequest load;
  load.set_model_name("mlp");
  inference::RepositoryModelLoadResponse load_response;
  ASSERT_TRUE(harness.inference->RepositoryModelLoad(&load_context, load, &load_response).ok());
  infer_from_8_clients(&reloaded);
  EXPECT_EQ(reloaded, (std::map<int, int>{{grpc::StatusCode::OK, 64}}));
}

TEST(ServerRepository, ABrokenModelIsReportedAndDoesNotStopTheOthers) {
  const std::string repository = ExampleRepository({"mlp"});
  CopyTree(ExampleArtifact("loop"), repository + "/broken/1");
  fs::resize_file(repository + "/broken/1/MANIFEST.pb", 7);
  Harness harness(repository);
  auto index = harness.Index();
  EXPECT_EQ(index["mlp"].state(), "READY");
  EXPECT_EQ(index["broken"].state(), "UNAVAILABLE");
  // Strict readiness (the default): a model that failed to load keeps the
  // server out of a load balancer's rotation, while it serves what it has.
  EXPECT_FALSE(harness.server->ready());
  EXPECT_THAT(index["broken"].reason(),
              HasSubstr("version 1 failed to load"));
  EXPECT_THAT(index["broken"].reason(), HasSubstr("MANIFEST.pb is not a valid manifest"));

  inference::ModelInferResponse response;
  grpc::Status status = harness.Infer(SlowLoopRequest(1), &response);  // "loop" is unknown here
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  inference::ModelInferRequest broken = MlpRequest();
  broken.set_model_name("broken");
  status = harness.Infer(broken, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("MANIFEST.pb is not a valid manifest"));
  EXPECT_TRUE(harness.Infer(MlpRequest(), &response).ok());

  // A broken newer version of a served model: the older one keeps serving.
  CopyTree(ExampleArtifact("mlp"), repository + "/mlp/3");
  fs::remove(repository + "/mlp/3/FRAMES");
  harness.Rescan();
  index = harness.Index();
  EXPECT_EQ(index["mlp"].state(), "READY");
  EXPECT_EQ(index["mlp"].version(), "1");
  EXPECT_THAT(index["mlp"].reason(), HasSubstr("version 3 failed to load"));
  EXPECT_TRUE(harness.Infer(MlpRequest(), &response).ok());

  const std::string metrics = HttpGet(harness.server->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(metrics, "precompile_model_load_failures_total{model=\"broken\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "precompile_model_load_failures_total{model=\"mlp\"}"), 1);
  EXPECT_EQ(MetricValue(metrics, "precompile_models_loaded"), 1);

  // Once the broken model is fixed, the server is ready again.
  fs::remove_all(repository + "/broken/1");
  CopyTree(ExampleArtifact("loop"), repository + "/broken/1");
  harness.Rescan();
  EXPECT_EQ(harness.Index()["broken"].state(), "READY");
  EXPECT_TRUE(harness.server->ready());
}

TEST(ServerRepository, RequestsBeyondTheConcurrencyLimitGetResourceExhausted) {
  const std::string repository = ExampleRepository({"loop"});
  Harness harness(repository, /*max_concurrent_requests=*/1);
  grpc::ClientContext slow_context;
  // A bound for when cancelling fails, so that the test fails, not hangs.
  slow_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  grpc::Status slow_status;
  std::thread slow =
      InferInBackground(harness, &slow_context, EndlessLoopRequest(), &slow_status);
  absl::SleepFor(absl::Milliseconds(300));
  inference::ModelInferResponse response;
  grpc::Status status = harness.Infer(SlowLoopRequest(0), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("limit of 1 concurrent inference requests"));
  slow_context.TryCancel();
  slow.join();
  EXPECT_EQ(slow_status.error_code(), grpc::StatusCode::CANCELLED) << slow_status.error_message();
  // The cancelled request gives its place back once the server sees the
  // cancellation (at the loop's next iteration).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  status = harness.Infer(SlowLoopRequest(0), &response);
  while (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    status = harness.Infer(SlowLoopRequest(0), &response);
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(ServerRepository, AnEagerMissLeavesTheOnlyInferenceThreadToOtherRequests) {
  const std::string repository = ExampleRepository({"loop"});
  // One inference thread: a request that came while the miss runs could only
  // be answered before the miss ends if the miss gave its run slot back
  // while its eager program runs on an eager thread.
  Harness harness(repository, /*max_concurrent_requests=*/4, absl::ZeroDuration(),
                  /*inference_threads=*/1);
  std::atomic<bool> slow_done{false};
  grpc::ClientContext slow_context;
  // A bound for when cancelling fails, so that the test fails, not hangs.
  slow_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  grpc::Status slow_status;
  std::thread slow =
      InferInBackground(harness, &slow_context, EndlessLoopRequest(), &slow_status, &slow_done);
  absl::SleepFor(absl::Milliseconds(300));

  grpc::ClientContext metadata_context;
  inference::ModelMetadataRequest metadata_request;
  metadata_request.set_name("loop");
  inference::ModelMetadataResponse metadata;
  EXPECT_TRUE(harness.inference->ModelMetadata(&metadata_context, metadata_request, &metadata)
                  .ok());
  grpc::ClientContext health_context;
  grpc::health::v1::HealthCheckResponse health;
  EXPECT_TRUE(grpc::health::v1::Health::NewStub(harness.channel)
                  ->Check(&health_context, {}, &health)
                  .ok());
  // A variant hit is answered while the slow miss still runs.
  inference::ModelInferResponse hit;
  EXPECT_TRUE(harness.Infer(SlowLoopRequest(0), &hit).ok());
  EXPECT_EQ(hit.parameters().at("precompile_outcome").string_param(), "variant");
  EXPECT_FALSE(slow_done) << "the slow miss ended before the hit was checked";
  // Another miss waits for the one eager thread, not for a run slot: the
  // hit after it is answered before either miss ends, and both are answered.
  grpc::ClientContext short_context;
  short_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::Status short_status;
  std::thread short_miss =
      InferInBackground(harness, &short_context, SlowLoopRequest(3), &short_status);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  double eager_queued = 0;
  while (eager_queued != 1 && absl::Now() < deadline) {
    eager_queued = MetricValue(HttpGet(harness.server->metrics_port(), "/metrics"),
                               "precompile_eager_queued");
    if (eager_queued != 1) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(eager_queued, 1);
  inference::ModelInferResponse hit_after;
  EXPECT_TRUE(harness.Infer(SlowLoopRequest(0), &hit_after).ok());
  EXPECT_EQ(hit_after.parameters().at("precompile_outcome").string_param(), "variant");
  EXPECT_FALSE(slow_done) << "the slow miss ended before the second hit was checked";
  // The queued miss runs once the slow one gives the eager thread back.
  slow_context.TryCancel();
  slow.join();
  EXPECT_EQ(slow_status.error_code(), grpc::StatusCode::CANCELLED) << slow_status.error_message();
  short_miss.join();
  EXPECT_TRUE(short_status.ok()) << short_status.error_message();
}

TEST(ServerRepository, StopsCleanlyWhileARequestStillRuns) {
  const std::string repository = ExampleRepository({"loop"});
  Harness harness(repository);
  // The client gives up at once; the server's eager loop runs on.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  inference::ModelInferResponse response;
  grpc::Status status =
      harness.inference->ModelInfer(&context, SlowLoopRequest(300000), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Destroying the server waits for the running call to be answered (its
  // answer goes nowhere) before its completion queue shuts down; answering
  // on a queue that had shut down aborted the process.
  harness.server.reset();
}

TEST(ServerRepository, ACancelledRequestStopsBeforeItsNextFrame) {
  const std::string repository = ExampleRepository({"nested"});
  Harness harness(repository);
  // nested(k): encoder, then k calls of the frame wobble in a loop (slow,
  // eager), then scale. The deadline passes long before the loop could end.
  inference::ModelInferRequest request = testing::ZerosRequest("nested");
  (*request.mutable_parameters())["k"].set_int64_param(300000);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  inference::ModelInferResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status = harness.inference->ModelInfer(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "the client waited for the run";

  // The server notices once the loop ends, before calling scale.
  const std::string cancelled =
      "precompile_requests_total{model=\"nested\",outcome=\"cancelled\",version=\"1\"}";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string metrics;
  while (absl::Now() < deadline) {
    metrics = HttpGet(harness.server->metrics_port(), "/metrics");
    if (MetricValue(metrics, cancelled) == 1) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(MetricValue(metrics, cancelled), 1);
  // It stopped inside the loop (at a wobble call, each of which is a frame
  // call) or before it; scale, after the loop, never ran.
  const double wobbles = MetricValue(
      metrics, "precompile_frame_calls_total{frame=\"wobble\",model=\"nested\","
               "outcome=\"eager_fallback\",version=\"1\"}");
  EXPECT_GE(wobbles, 0);
  EXPECT_LT(wobbles, 300000);
  EXPECT_EQ(MetricValue(metrics, "precompile_variant_hits_total{frame=\"scale\",model=\"nested\","
                                 "variant=\"scale#0\",version=\"1\"}"),
            0);
}

TEST(ServerRepository, RefusesToStartWithoutAPollerToSpare) {
  server::ServerOptions options;
  options.model_repository = ExampleRepository({"mlp"});
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.inference_threads = 2;
  options.inference_pollers = 2;
  auto server = server::Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(),
              HasSubstr("--inference_pollers must exceed --inference_threads (2)"));
  options.inference_pollers = 3;
  EXPECT_TRUE(server::Server::Start(options).ok());
}

TEST(ServerRepository, RefusesMessagesOverTheSizeLimit) {
  server::ServerOptions options;
  options.model_repository = ExampleRepository({"mlp"});
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.max_message_bytes = 4096;
  auto server = server::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  inference::ModelInferRequest big = MlpRequest();
  big.mutable_inputs(0)->set_shape(0, 1024);
  big.set_raw_input_contents(0, std::string(1024 * 4 * sizeof(float), '\0'));
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  grpc::Status status = stub->ModelInfer(&context, big, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  grpc::ClientContext small_context;
  EXPECT_TRUE(stub->ModelInfer(&small_context, MlpRequest(), &response).ok());
}

TEST(ServerRepository, AdminAndRepositoryCallsNeedTheTokenWhenOneIsSet) {
  const std::string repository = ExampleRepository({"mlp"});
  server::ServerOptions options;
  options.model_repository = repository;
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.admin_token = "s3cret";
  auto server = server::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto admin = precompile::v1::PrecompileAdmin::NewStub(channel);
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  precompile::v1::ModelRequest request;
  request.set_name("mlp");
  precompile::v1::SummaryResponse summary;
  {
    grpc::ClientContext context;
    grpc::Status status = admin->GetSummary(&context, request, &summary);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer wrong!");
    EXPECT_EQ(admin->GetSummary(&context, request, &summary).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret");
    EXPECT_TRUE(admin->GetSummary(&context, request, &summary).ok());
  }
  {
    grpc::ClientContext context;
    inference::RepositoryModelUnloadRequest unload;
    unload.set_model_name("mlp");
    inference::RepositoryModelUnloadResponse unloaded;
    EXPECT_EQ(inference->RepositoryModelUnload(&context, unload, &unloaded).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Inference itself needs no token.
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  EXPECT_TRUE(inference->ModelInfer(&context, MlpRequest(), &response).ok());
}

TEST(ServerRepository, ClientsAreAskedToReconnectAfterTheMaximumConnectionAge) {
  const std::string repository = ExampleRepository({"mlp"});
  for (absl::Duration age : {absl::Seconds(1), absl::ZeroDuration()}) {
    server::ServerOptions options;
    options.model_repository = repository;
    options.grpc_address = "127.0.0.1:0";
    options.metrics_address = "";
    options.max_connection_age = age;
    auto server = server::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                       grpc::InsecureChannelCredentials());
    auto inference = inference::GRPCInferenceService::NewStub(channel);
    {
      grpc::ClientContext context;
      inference::ServerLiveResponse live;
      ASSERT_TRUE(inference->ServerLive(&context, {}, &live).ok());
    }
    ASSERT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
    // Past the age (and gRPC's 10 % jitter) the server sends GOAWAY and the
    // channel leaves READY; without one, the connection stays.
    bool left_ready = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(4);
    while (!left_ready && absl::Now() < deadline) {
      left_ready = channel->GetState(false) != GRPC_CHANNEL_READY;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(left_ready, age > absl::ZeroDuration()) << "max_connection_age " << age;
  }
}

TEST(ServerRepository, ControlIsRefusedWithoutATokenAndChangesNothing) {
  const std::string repository = ExampleRepository({"mlp", "loop"});
  server::ServerOptions options;  // No token, and control not allowed: the default.
  options.model_repository = repository;
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "";
  auto server = server::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  // A model that appears after the start, which a rescan would load.
  CopyTree(ExampleArtifact("branch"), repository + "/branch/1");
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string((*server)->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto admin = precompile::v1::PrecompileAdmin::NewStub(channel);
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  auto expect_refused = [](const grpc::Status& status, const char* call) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << call;
    EXPECT_THAT(status.error_message(), HasSubstr("--admin_token_file")) << call;
    EXPECT_THAT(status.error_message(), HasSubstr("--allow_unauthenticated_control")) << call;
  };
  precompile::v1::ModelRequest mlp;
  mlp.set_name("mlp");
  {
    grpc::ClientContext context;
    precompile::v1::UnloadModelResponse response;
    expect_refused(admin->UnloadModel(&context, mlp, &response), "UnloadModel");
  }
  {
    grpc::ClientContext context;
    precompile::v1::LoadModelResponse response;
    expect_refused(admin->LoadModel(&context, mlp, &response), "LoadModel");
  }
  {
    grpc::ClientContext context;
    precompile::v1::RescanResponse response;
    expect_refused(admin->Rescan(&context, {}, &response), "Rescan");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer anything");
    inference::RepositoryModelUnloadRequest unload;
    unload.set_model_name("mlp");
    inference::RepositoryModelUnloadResponse response;
    expect_refused(inference->RepositoryModelUnload(&context, unload, &response),
                   "RepositoryModelUnload");
  }
  {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest load;
    load.set_model_name("branch");
    inference::RepositoryModelLoadResponse response;
    expect_refused(inference->RepositoryModelLoad(&context, load, &response),
                   "RepositoryModelLoad");
  }
  // Reading calls answer, and show the repository as it was.
  {
    grpc::ClientContext context;
    precompile::v1::ListModelsResponse listed;
    ASSERT_TRUE(admin->ListModels(&context, {}, &listed).ok());
    std::vector<std::string> ready;
    for (const auto& m : listed.models()) {
      if (m.state() == precompile::v1::ModelStatus::READY) ready.push_back(m.name());
    }
    EXPECT_THAT(ready, ::testing::UnorderedElementsAre("mlp", "loop"));
  }
  {
    grpc::ClientContext context;
    precompile::v1::SummaryResponse summary;
    EXPECT_TRUE(admin->GetSummary(&context, mlp, &summary).ok());
  }
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  EXPECT_TRUE(inference->ModelInfer(&context, MlpRequest(), &response).ok());
}

}  // namespace
}  // namespace precompile
