// Dynamic batching end to end: the real server on loopback serving the
// bundled mlp (variants: batch 8, and batch from 2 up) with Triton's
// max_batch_size and dynamic_batching in its config.pbtxt, beside the same
// artifact without them, called through the generated KServe v2 stubs.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/inference.grpc.pb.h"
#include "runtime/inference_memory.h"
#include "server/server.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/http.h"

namespace precompile {
namespace {

using ::precompile::testing::CopyTree;
using ::precompile::testing::ExampleArtifact;
using ::precompile::testing::HttpGet;
using ::precompile::testing::MetricValue;
using ::precompile::testing::NewTempDirectory;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// No sum of the tests' requests but 8 is a preferred size: they wait for the
// others, whatever order they come in.
constexpr char kBatched[] = R"pb(
  max_batch_size: 16
  dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [7, 8] }
)pb";

// A float32 request for `model` of `rows` rows of `width`, its values
// following from `seed`.
inference::ModelInferRequest Request(const std::string& model, int64_t rows, int64_t width,
                                     int seed) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  input->add_shape(rows);
  input->add_shape(width);
  std::vector<float> values(static_cast<size_t>(rows * width));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = std::sin(static_cast<float>(seed * 131 + static_cast<int>(i)));
  }
  request.add_raw_input_contents(values.data(), values.size() * sizeof(float));
  return request;
}

std::vector<float> Floats(const inference::ModelInferResponse& response) {
  const std::string& raw = response.raw_output_contents(0);
  std::vector<float> values(raw.size() / sizeof(float));
  std::memcpy(values.data(), raw.data(), values.size() * sizeof(float));
  return values;
}

// Float32 values from another run of the model (another batch, another
// variant): equal within 1e-4, relative and absolute.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_NEAR(got[k], want[k], 1e-4 + 1e-4 * std::abs(want[k])) << "value " << k;
  }
}

// Copies the example artifact `artifact` to <root>/<name>/1, with `config`
// as the model's config.pbtxt ("": none).
void AddModel(const std::string& root, const std::string& name, const std::string& artifact,
              const std::string& config) {
  std::filesystem::create_directories(root + "/" + name);
  CopyTree(ExampleArtifact(artifact), root + "/" + name + "/1");
  if (!config.empty()) std::ofstream(root + "/" + name + "/config.pbtxt") << config;
}

std::unique_ptr<inference::GRPCInferenceService::Stub> StubOf(const server::Server& server) {
  return inference::GRPCInferenceService::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(server.grpc_port()), grpc::InsecureChannelCredentials()));
}

std::string Variant(const inference::ModelInferResponse& response) {
  return response.parameters().at("precompile_variant").string_param();
}

class BatchingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = NewTempDirectory("batching");
    AddModel(root, "mlp", "mlp", kBatched);
    AddModel(root, "mlp_alone", "mlp", "");
    AddModel(root, "mlp_preferred", "mlp", R"pb(
      max_batch_size: 16
      dynamic_batching { max_queue_delay_microseconds: 30000000 preferred_batch_size: [2, 8] }
    )pb");
    // Its deadline comes long before its batch's delay.
    AddModel(root, "mlp_deadline", "mlp",
             absl::StrCat(kBatched, R"pb(parameters {
                            key: "max_request_seconds" value { string_value: "0.3" } })pb"));
    // Static variants only, at batches 1, 4 and 8.
    AddModel(root, "mlp_static", "mlp_static",
             "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 300000 }");
    AddModel(root, "mlp_static_alone", "mlp_static", "");
    // A batch waits 0.3 s for others: long enough for the tests' concurrent
    // requests to meet, short enough for a lone one.
    AddModel(root, "mlp_short_delay", "mlp",
             "max_batch_size: 16 dynamic_batching { max_queue_delay_microseconds: 300000 }");
    // x[: x.size(0) // 2] has half the rows: it cannot batch.
    AddModel(root, "passthrough", "passthrough", "max_batch_size: 2048");
    server::ServerOptions options;
    options.model_repository = root;
    options.grpc_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.http_address = "127.0.0.1:0";
    auto server = server::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    stub_ = StubOf(*server_).release();
  }

  static void TearDownTestSuite() {
    delete stub_;
    delete server_;
  }

  static grpc::Status Infer(const inference::ModelInferRequest& request,
                            inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return stub_->ModelInfer(&context, request, response);
  }

  // Sends `requests` at once, each from its own thread.
  static std::vector<std::pair<grpc::Status, inference::ModelInferResponse>> InferAll(
      const std::vector<inference::ModelInferRequest>& requests) {
    std::vector<std::pair<grpc::Status, inference::ModelInferResponse>> answers(requests.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
      threads.emplace_back(
          [&, i] { answers[i].first = Infer(requests[i], &answers[i].second); });
    }
    for (std::thread& t : threads) t.join();
    return answers;
  }

  static inference::ModelStatistics Statistics(const std::string& model) {
    grpc::ClientContext context;
    inference::ModelStatisticsRequest request;
    request.set_name(model);
    inference::ModelStatisticsResponse response;
    EXPECT_TRUE(stub_->ModelStatistics(&context, request, &response).ok());
    return response.model_stats_size() == 1 ? response.model_stats(0)
                                            : inference::ModelStatistics();
  }

  static std::string Metrics() { return HttpGet(server_->metrics_port(), "/metrics"); }

  static server::Server* server_;
  static inference::GRPCInferenceService::Stub* stub_;
};

server::Server* BatchingTest::server_ = nullptr;
inference::GRPCInferenceService::Stub* BatchingTest::stub_ = nullptr;

TEST_F(BatchingTest, MergesConcurrentRequestsIntoOneRunAndAnswersEachWithItsRows) {
  const inference::ModelStatistics before = Statistics("mlp");
  const double runs_before =
      MetricValue(Metrics(), "precompile_batch_rows_count{model=\"mlp\",version=\"1\"}");
  // Four requests of 2 rows: together the 8 rows that fill a batch.
  std::vector<inference::ModelInferRequest> requests;
  for (int seed = 0; seed < 4; ++seed) requests.push_back(Request("mlp", 2, 4, seed));
  const auto answers = InferAll(requests);

  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [status, response] = answers[i];
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(Variant(response), HasSubstr("forward#"));
    EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 8);
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).shape(0), 2) << "each request gets its own rows";
    // The same request alone, to the same artifact without batching.
    inference::ModelInferRequest alone = requests[i];
    alone.set_model_name("mlp_alone");
    inference::ModelInferResponse reference;
    ASSERT_TRUE(Infer(alone, &reference).ok());
    SCOPED_TRACE(absl::StrCat("request ", i));
    ExpectClose(Floats(response), Floats(reference));
  }
  const inference::ModelStatistics after = Statistics("mlp");
  EXPECT_EQ(after.inference_count() - before.inference_count(), 8u) << "rows";
  EXPECT_EQ(after.execution_count() - before.execution_count(), 1u) << "one run";
  EXPECT_EQ(after.inference_stats().success().count() - before.inference_stats().success().count(),
            4u);
  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, "precompile_batch_rows_count{model=\"mlp\",version=\"1\"}") -
                std::max(runs_before, 0.0),
            1);
  EXPECT_EQ(MetricValue(metrics, "precompile_requests_total{model=\"mlp\",outcome=\"variant\","
                                 "version=\"1\"}") -
                static_cast<double>(before.inference_stats().success().count()),
            4);
}

TEST_F(BatchingTest, AMergedBatchNoVariantTakesIsPaddedUpToAStaticVariantsBatch) {
  const inference::ModelStatistics before = Statistics("mlp_static");
  // Two requests of 1 row, each served alone by the batch-1 variant: merged,
  // their 2 rows are padded to the batch-4 variant.
  const std::vector<inference::ModelInferRequest> requests = {Request("mlp_static", 1, 4, 50),
                                                              Request("mlp_static", 1, 4, 51)};
  const auto answers = InferAll(requests);
  for (size_t i = 0; i < 2; ++i) {
    const auto& [status, response] = answers[i];
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 2);
    EXPECT_EQ(response.parameters().at("precompile_batch_padding_rows").int64_param(), 2);
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).shape(0), 1) << "the padding's rows are dropped";
    inference::ModelInferRequest alone = requests[i];
    alone.set_model_name("mlp_static_alone");
    inference::ModelInferResponse reference;
    ASSERT_TRUE(Infer(alone, &reference).ok());
    EXPECT_NE(Variant(reference), Variant(response)) << "alone, the batch-1 variant";
    SCOPED_TRACE(absl::StrCat("request ", i));
    ExpectClose(Floats(response), Floats(reference));
  }
  const inference::ModelStatistics after = Statistics("mlp_static");
  EXPECT_EQ(after.execution_count() - before.execution_count(), 1u) << "one run";
  EXPECT_EQ(after.inference_count() - before.inference_count(), 2u)
      << "the requests' rows, not the padding";
}

// `request` with its rows from `first` on, `rows` of them, for `model`.
inference::ModelInferRequest Rows(inference::ModelInferRequest request, const std::string& model,
                                  int64_t first, int64_t rows) {
  const int64_t width = request.inputs(0).shape(1);
  const std::string raw =
      request.raw_input_contents(0).substr(static_cast<size_t>(first * width) * sizeof(float),
                                           static_cast<size_t>(rows * width) * sizeof(float));
  request.set_model_name(model);
  request.mutable_inputs(0)->set_shape(0, rows);
  request.clear_raw_input_contents();
  request.add_raw_input_contents(raw);
  return request;
}

TEST_F(BatchingTest, ARequestNoVariantServesAloneRunsWithItsRowsPaddedUpToAVariantsBatch) {
  // A Triton client's request of one row: mlp's variants take batches of 8
  // and from 2 up (Dynamo's dynamic sizes start at 2), so alone it is
  // refused; with batching, it is padded with a copy of its row to 2.
  const inference::ModelStatistics before = Statistics("mlp_short_delay");
  const inference::ModelInferRequest one_row = Request("mlp_short_delay", 1, 4, 60);
  inference::ModelInferResponse response;
  grpc::Status status = Infer(one_row, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 1);
  EXPECT_EQ(response.parameters().at("precompile_batch_padding_rows").int64_param(), 1);
  ASSERT_EQ(response.outputs(0).shape(0), 1) << "the padding's row is dropped";
  inference::ModelInferResponse reference;
  EXPECT_EQ(Infer(Rows(one_row, "mlp_alone", 0, 1), &reference).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  inference::ModelInferRequest twice = Rows(one_row, "mlp_alone", 0, 1);
  twice.mutable_inputs(0)->set_shape(0, 2);
  twice.mutable_raw_input_contents(0)->append(twice.raw_input_contents(0));
  ASSERT_TRUE(Infer(twice, &reference).ok());
  std::vector<float> first_row = Floats(reference);
  first_row.resize(first_row.size() / 2);
  ExpectClose(Floats(response), first_row);
  const inference::ModelStatistics after = Statistics("mlp_short_delay");
  EXPECT_EQ(after.execution_count() - before.execution_count(), 1u);
  EXPECT_EQ(after.inference_count() - before.inference_count(), 1u) << "not the padding";

  // mlp_static's variants take batches of 1, 4 and 8: two rows are padded
  // to 4, and each row's answer is the one it gets alone.
  const inference::ModelInferRequest two_rows = Request("mlp_static", 2, 4, 61);
  ASSERT_TRUE(Infer(two_rows, &response).ok());
  EXPECT_EQ(response.parameters().at("precompile_batch_padding_rows").int64_param(), 2);
  ASSERT_EQ(response.outputs(0).shape(0), 2);
  EXPECT_EQ(Infer(Rows(two_rows, "mlp_static_alone", 0, 2), &reference).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  std::vector<float> each_alone;
  for (int64_t row = 0; row < 2; ++row) {
    ASSERT_TRUE(Infer(Rows(two_rows, "mlp_static_alone", row, 1), &reference).ok());
    const std::vector<float> values = Floats(reference);
    each_alone.insert(each_alone.end(), values.begin(), values.end());
  }
  ExpectClose(Floats(response), each_alone);
}

// A padded call is a copy of the request's rows and their padding: host
// memory that counts against --max_inference_memory_bytes as the calls'
// tensors do. Here the calls may hold 16 bytes more than they do, and the
// 1-row request padded to 2 rows needs 32.
TEST_F(BatchingTest, PaddingThatDoesNotFitInTheInferenceMemoryIsRefusedByName) {
  const inference::ModelInferRequest one_row = Request("mlp_short_delay", 1, 4, 62);
  inference::ModelInferResponse response;
  {
    absl::StatusOr<ChargedBytes> taken =
        ChargedBytes::Charge(InferenceMemoryLimit() - InferenceMemoryHeld() - 16, "the test");
    ASSERT_TRUE(taken.ok()) << taken.status();
    const grpc::Status refused = Infer(one_row, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(
        refused.error_message(),
        AllOf(HasSubstr("model 'mlp_short_delay': padding a request's rows from 1 to 2"),
              HasSubstr("stacked inputs of 32 bytes"), HasSubstr("--max_inference_memory_bytes")));
  }
  const grpc::Status served = Infer(one_row, &response);
  ASSERT_TRUE(served.ok()) << served.error_message();
  EXPECT_EQ(response.parameters().at("precompile_batch_padding_rows").int64_param(), 1);
}

TEST_F(BatchingTest, ABatchAtAPreferredSizeRunsWithoutWaitingWhenNoOtherRequestIsThere) {
  const inference::ModelStatistics before = Statistics("mlp_preferred");
  // 2 rows is a preferred size, and nothing else waits: it runs now, not
  // after the 30 s delay.
  std::promise<std::pair<grpc::Status, inference::ModelInferResponse>> answer;
  std::thread client([&] {
    inference::ModelInferResponse response;
    grpc::Status status = Infer(Request("mlp_preferred", 2, 4, 40), &response);
    answer.set_value({status, response});
  });
  std::future<std::pair<grpc::Status, inference::ModelInferResponse>> done = answer.get_future();
  const bool answered = done.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  client.join();
  ASSERT_TRUE(answered) << "it waited for the batch's delay";
  const auto [status, response] = done.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 2);
  const inference::ModelStatistics after = Statistics("mlp_preferred");
  EXPECT_EQ(after.execution_count() - before.execution_count(), 1u);
}

TEST_F(BatchingTest, GrpcAndHttpRequestsShareABatch) {
  const inference::ModelStatistics before = Statistics("mlp");
  // Two gRPC requests of 2 rows wait; an HTTP request of 4 rows fills the
  // batch of 8.
  std::vector<std::pair<grpc::Status, inference::ModelInferResponse>> by_grpc(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back(
        [&, i] { by_grpc[i].first = Infer(Request("mlp", 2, 4, 20 + i), &by_grpc[i].second); });
  }
  const inference::ModelInferRequest http_request = Request("mlp", 4, 4, 30);
  const std::string& raw = http_request.raw_input_contents(0);
  const std::string header = absl::StrCat(
      R"({"inputs":[{"name":"x","shape":[4,4],"datatype":"FP32","parameters":{"binary_data_size":)",
      raw.size(), R"(}}],"parameters":{"binary_data_output":true}})");
  httplib::Client http("127.0.0.1", server_->http_port());
  http.set_read_timeout(60, 0);
  httplib::Result by_http =
      http.Post("/v2/models/mlp/infer",
                {{"Inference-Header-Content-Length", std::to_string(header.size())}},
                header + raw, "application/octet-stream");
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(by_http);
  ASSERT_EQ(by_http->status, 200) << by_http->body;
  for (const auto& [status, response] : by_grpc) {
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.outputs(0).shape(0), 2);
  }
  // The HTTP answer's rows are those the request gets alone.
  inference::ModelInferRequest alone = http_request;
  alone.set_model_name("mlp_alone");
  inference::ModelInferResponse reference;
  ASSERT_TRUE(Infer(alone, &reference).ok());
  const size_t json_length =
      std::stoul(by_http->get_header_value("Inference-Header-Content-Length"));
  const std::string http_raw = by_http->body.substr(json_length);
  ASSERT_EQ(http_raw.size(), reference.raw_output_contents(0).size());
  std::vector<float> got(http_raw.size() / sizeof(float));
  std::memcpy(got.data(), http_raw.data(), got.size() * sizeof(float));
  ExpectClose(got, Floats(reference));
  const inference::ModelStatistics after = Statistics("mlp");
  EXPECT_EQ(after.execution_count() - before.execution_count(), 1u);
  EXPECT_EQ(after.inference_count() - before.inference_count(), 8u);
}

TEST_F(BatchingTest, RequestsThatNoVariantServesEvenPaddedAreAnsweredAsAloneAndJoinNoBatch) {
  // Two requests wait in a batch: 2 and 3 rows of the 8 that fill it.
  std::vector<std::pair<grpc::Status, inference::ModelInferResponse>> waited(2);
  std::vector<std::thread> waiting;
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back(
        [&, i] { waited[i].first = Infer(Request("mlp", 2 + i, 4, i), &waited[i].second); });
  }
  // These are answered as they are alone, while the batch waits: no
  // variant takes 5 columns, and no request 17 rows.
  inference::ModelInferResponse response;
  grpc::Status wider = Infer(Request("mlp", 2, 5, 7), &response);
  EXPECT_EQ(wider.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(wider.error_message(), HasSubstr("x.size(1)"));
  grpc::Status too_many = Infer(Request("mlp", 17, 4, 7), &response);
  EXPECT_EQ(too_many.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_many.error_message(),
              AllOf(HasSubstr("17 rows"), HasSubstr("max_batch_size 16")));
  // Three more rows fill the batch, which then runs.
  ASSERT_TRUE(Infer(Request("mlp", 3, 4, 9), &response).ok());
  EXPECT_EQ(response.outputs(0).shape(0), 3);
  EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 8);
  for (std::thread& t : waiting) t.join();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(waited[i].first.ok()) << waited[i].first.error_message();
    EXPECT_EQ(waited[i].second.outputs(0).shape(0), 2 + i);
  }
}

TEST_F(BatchingTest, ARequestWhoseDeadlineComesBeforeItsBatchsDelayRunsAloneAtOnce) {
  // Its limit is 0.3 s, the delay 30 s: waiting for others would fail it.
  inference::ModelInferResponse response;
  grpc::Status status = Infer(Request("mlp_deadline", 2, 4, 0), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.parameters().at("precompile_batch_rows").int64_param(), 2);
  // One row, which only padding serves, runs padded at once.
  status = Infer(Request("mlp_deadline", 1, 4, 0), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.parameters().at("precompile_batch_padding_rows").int64_param(), 1);
}

TEST_F(BatchingTest, ReportsItsConfigAndShapesAsTritonDoesForBatchingModels) {
  grpc::ClientContext c1;
  inference::ModelConfigRequest config_request;
  config_request.set_name("mlp");
  inference::ModelConfigResponse config;
  ASSERT_TRUE(stub_->ModelConfig(&c1, config_request, &config).ok());
  EXPECT_EQ(config.config().max_batch_size(), 16);
  EXPECT_THAT(config.config().input(0).dims(), ElementsAre(4)) << "without the batch";
  EXPECT_THAT(config.config().dynamic_batching().preferred_batch_size(), ElementsAre(7, 8));
  EXPECT_EQ(config.config().dynamic_batching().max_queue_delay_microseconds(), 30000000u);

  grpc::ClientContext c2;
  config_request.set_name("mlp_alone");
  ASSERT_TRUE(stub_->ModelConfig(&c2, config_request, &config).ok());
  EXPECT_EQ(config.config().max_batch_size(), 0);
  EXPECT_THAT(config.config().input(0).dims(), ElementsAre(-1, 4));
  EXPECT_FALSE(config.config().has_dynamic_batching());

  grpc::ClientContext c3;
  inference::ModelMetadataRequest metadata_request;
  metadata_request.set_name("mlp");
  inference::ModelMetadataResponse metadata;
  ASSERT_TRUE(stub_->ModelMetadata(&c3, metadata_request, &metadata).ok());
  EXPECT_THAT(metadata.inputs(0).shape(), ElementsAre(-1, 4));
}

TEST_F(BatchingTest, RefusesToLoadAModelWhoseOutputsDoNotKeepTheRows) {
  grpc::ClientContext context;
  inference::RepositoryIndexRequest request;
  inference::RepositoryIndexResponse index;
  ASSERT_TRUE(stub_->RepositoryIndex(&context, request, &index).ok());
  bool found = false;
  for (const auto& model : index.models()) {
    if (model.name() != "passthrough") continue;
    found = true;
    EXPECT_EQ(model.state(), "UNAVAILABLE");
    EXPECT_THAT(model.reason(), AllOf(HasSubstr("max_batch_size in config.pbtxt"),
                                      HasSubstr("output 'output1'"),
                                      HasSubstr("not its inputs' rows")));
  }
  EXPECT_TRUE(found);
}

TEST(BatchingDrain, ADrainRunsTheBatchesWaitingAndAnswersThem) {
  const std::string root = NewTempDirectory("batching_drain");
  // A batch that would wait a minute for more requests.
  AddModel(root, "mlp", "mlp",
           "max_batch_size: 16 dynamic_batching { max_queue_delay_microseconds: 60000000 }");
  server::ServerOptions options;
  options.model_repository = root;
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.drain_timeout = absl::Seconds(20);
  auto server = server::Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = StubOf(**server);
  grpc::Status status;
  inference::ModelInferResponse response;
  std::thread client([&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    status = stub->ModelInfer(&context, Request("mlp", 2, 4, 0), &response);
  });
  // Waiting in its batch, as the gauge says.
  while (MetricValue(HttpGet((*server)->metrics_port(), "/metrics"),
                     "precompile_batch_waiting") < 1) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  // Within the drain timeout, a third of the delay: the batch ran at once.
  EXPECT_TRUE((*server)->Stop().ok());
  client.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.outputs(0).shape(0), 2);
}

}  // namespace
}  // namespace precompile
