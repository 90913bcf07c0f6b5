// End-to-end: the real server on loopback serving the bundled example
// artifacts, called through the generated KServe v2, admin and health stubs,
// with metrics scraped over HTTP.
#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "proto/admin.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/inference.grpc.pb.h"
#include "proto/reflection.grpc.pb.h"
#include "runtime/torch_dtype.h"
#include "server/api/tensor_codec.h"
#include "server/grpc/infer_response.h"
#include "server/server.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/http.h"
#include "tests/testing/reference.h"

namespace precompile {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::precompile::testing::CopyTree;
using ::precompile::testing::ExampleArtifact;
using ::precompile::testing::ExampleRepository;
using ::precompile::testing::HttpGet;
using ::precompile::testing::MetricValue;
using ::precompile::testing::Reference;
using ::precompile::testing::ReferenceCall;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A request carrying a reference call: tensors raw, scalars as parameters.
inference::ModelInferRequest RequestFor(const std::string& model,
                                        const ReferenceCall& ref) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  request.set_id("test");
  for (const NamedValue& arg : ref.args) {
    if (const auto* t = std::get_if<TensorArg>(&arg.value)) {
      auto* input = request.add_inputs();
      input->set_name(arg.name);
      input->set_datatype(server::DatatypeOf(t->dtype));
      for (int64_t d : t->shape) input->add_shape(d);
      request.add_raw_input_contents(static_cast<const char*>(t->data), t->nbytes);
    } else if (const auto* b = std::get_if<bool>(&arg.value)) {
      (*request.mutable_parameters())[arg.name].set_bool_param(*b);
    } else if (const auto* i = std::get_if<int64_t>(&arg.value)) {
      (*request.mutable_parameters())[arg.name].set_int64_param(*i);
    } else if (const auto* f = std::get_if<double>(&arg.value)) {
      (*request.mutable_parameters())[arg.name].set_double_param(*f);
    }
  }
  return request;
}

at::Tensor OutputTensor(const inference::ModelInferResponse& response, int i) {
  std::vector<int64_t> shape(response.outputs(i).shape().begin(),
                             response.outputs(i).shape().end());
  const std::string& raw = response.raw_output_contents(i);
  std::optional<DType> dtype = server::DTypeFromDatatype(response.outputs(i).datatype());
  EXPECT_TRUE(dtype.has_value()) << response.outputs(i).datatype();
  return at::from_blob(const_cast<char*>(raw.data()), shape,
                       ToScalarType(dtype.value_or(DType::kFloat32)))
      .clone();
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repository_ = new std::string(
        ExampleRepository({"mlp", "loop", "branch", "nested", "passthrough", "dtypes"}));
    server::ServerOptions options;
    options.model_repository = *repository_;
    options.grpc_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.http_address = "127.0.0.1:0";
    auto server = server::Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                       grpc::InsecureChannelCredentials());
    inference_ = inference::GRPCInferenceService::NewStub(channel).release();
    admin_ = precompile::v1::PrecompileAdmin::NewStub(channel).release();
    health_ = grpc::health::v1::Health::NewStub(channel).release();
  }

  static void TearDownTestSuite() {
    delete inference_;
    delete admin_;
    delete health_;
    delete server_;
  }

  grpc::Status Infer(const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    return inference_->ModelInfer(&context, request, response);
  }

  // Infers a reference call and checks the outputs against Python's.
  inference::ModelInferResponse InferAndCompare(const std::string& model,
                                                const std::string& call) {
    ReferenceCall ref = Reference(model, call);
    inference::ModelInferResponse response;
    grpc::Status status = Infer(RequestFor(model, ref), &response);
    EXPECT_TRUE(status.ok()) << model << "/" << call << ": " << status.error_message();
    if (!status.ok()) return response;
    EXPECT_EQ(response.outputs_size(), static_cast<int>(ref.expected.size()));
    for (int i = 0; i < response.outputs_size(); ++i) {
      EXPECT_EQ(response.outputs(i).datatype(), "FP32");
      EXPECT_TRUE(at::allclose(OutputTensor(response, i), ref.expected[i], 1e-4, 1e-5))
          << model << "/" << call;
    }
    return response;
  }

  static std::string Outcome(const inference::ModelInferResponse& r) {
    return r.parameters().at("precompile_outcome").string_param();
  }
  static std::string Variant(const inference::ModelInferResponse& r) {
    return r.parameters().at("precompile_variant").string_param();
  }

  HealthCheckResponse::ServingStatus Health(const std::string& service) {
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::ClientContext context;
    grpc::Status status = health_->Check(&context, request, &response);
    return status.ok() ? response.status() : HealthCheckResponse::SERVICE_UNKNOWN;
  }

  std::string Metrics() { return HttpGet(server_->metrics_port(), "/metrics"); }

  static std::string* repository_;
  static server::Server* server_;
  static inference::GRPCInferenceService::Stub* inference_;
  static precompile::v1::PrecompileAdmin::Stub* admin_;
  static grpc::health::v1::Health::Stub* health_;
};

std::string* ServerTest::repository_ = nullptr;
server::Server* ServerTest::server_ = nullptr;
inference::GRPCInferenceService::Stub* ServerTest::inference_ = nullptr;
precompile::v1::PrecompileAdmin::Stub* ServerTest::admin_ = nullptr;
grpc::health::v1::Health::Stub* ServerTest::health_ = nullptr;

TEST_F(ServerTest, IsLiveReadyAndHealthyPerModel) {
  grpc::ClientContext c1, c2;
  inference::ServerLiveResponse live;
  ASSERT_TRUE(inference_->ServerLive(&c1, {}, &live).ok());
  EXPECT_TRUE(live.live());
  inference::ServerReadyResponse ready;
  ASSERT_TRUE(inference_->ServerReady(&c2, {}, &ready).ok());
  EXPECT_TRUE(ready.ready());
  EXPECT_EQ(Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("mlp"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health("no-such-model"), HealthCheckResponse::SERVICE_UNKNOWN);

  grpc::ClientContext c3;
  inference::ServerMetadataResponse metadata;
  ASSERT_TRUE(inference_->ServerMetadata(&c3, {}, &metadata).ok());
  EXPECT_EQ(metadata.name(), "precompile-serve");
  EXPECT_THAT(metadata.extensions(), ::testing::Contains("statistics"));
}

TEST_F(ServerTest, DescribesAModelsInputsAndOutputsFromItsArtifact) {
  grpc::ClientContext context;
  inference::ModelMetadataRequest request;
  request.set_name("mlp");
  inference::ModelMetadataResponse metadata;
  ASSERT_TRUE(inference_->ModelMetadata(&context, request, &metadata).ok());
  EXPECT_EQ(metadata.platform(), "precompile_serve");
  EXPECT_THAT(metadata.versions(), ElementsAre("1"));
  ASSERT_EQ(metadata.inputs_size(), 1);
  EXPECT_EQ(metadata.inputs(0).name(), "x");
  EXPECT_EQ(metadata.inputs(0).datatype(), "FP32");
  // Batch 8 in one variant, symbolic in the other: dynamic.
  EXPECT_THAT(metadata.inputs(0).shape(), ElementsAre(-1, 4));
  ASSERT_EQ(metadata.outputs_size(), 1);
  EXPECT_EQ(metadata.outputs(0).name(), "output0");
  EXPECT_EQ(metadata.outputs(0).datatype(), "FP32");
  EXPECT_THAT(metadata.outputs(0).shape(), ElementsAre(-1, 3));

  grpc::ClientContext c2;
  inference::ModelConfigRequest config_request;
  config_request.set_name("loop");
  inference::ModelConfigResponse config;
  ASSERT_TRUE(inference_->ModelConfig(&c2, config_request, &config).ok());
  EXPECT_EQ(config.config().max_batch_size(), 0);
  // The default version policy: the newest version that loads.
  EXPECT_EQ(config.config().version_policy().latest().num_versions(), 1u);
  ASSERT_EQ(config.config().input_size(), 1);
  EXPECT_EQ(config.config().input(0).data_type(), inference::TYPE_FP32);
  EXPECT_EQ(config.config().parameters().at("argument:n").string_value(), "int, default 0");
  // The instances of each variant: --runners_per_variant's default, on the CPU.
  ASSERT_EQ(config.config().instance_group_size(), 1);
  EXPECT_EQ(config.config().instance_group(0).count(), 2);
  EXPECT_EQ(config.config().instance_group(0).kind(), inference::ModelInstanceGroup::KIND_CPU);
}

TEST_F(ServerTest, ServesVariantsAndSaysWhichOne) {
  inference::ModelInferResponse r8 = InferAndCompare("mlp", "batch8");
  EXPECT_EQ(Outcome(r8), "variant");
  EXPECT_EQ(Variant(r8), "forward#0");
  EXPECT_EQ(r8.model_version(), "1");
  EXPECT_EQ(r8.id(), "test");
  EXPECT_EQ(Variant(InferAndCompare("mlp", "batch16")), "forward#1");
  EXPECT_EQ(Variant(InferAndCompare("mlp", "batch5")), "forward#1");
}

// Both transports at once, on one scheduler: every call answered, and the
// same input gets the same output bytes over HTTP (binary data) as over gRPC.
TEST_F(ServerTest, ServesHttpAndGrpcConcurrentlyWithTheSameBytes) {
  constexpr int kClients = 3;
  constexpr int kCalls = 10;
  std::atomic<int> failures{0};
  auto input = [](int client, int call) {
    std::vector<float> x(8 * 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i + client + 7 * call);
    return x;
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client http("127.0.0.1", server_->http_port());
      for (int k = 0; k < kCalls; ++k) {
        const std::vector<float> x = input(c, k);
        const std::string raw(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float));
        inference::ModelInferRequest request;
        request.set_model_name("mlp");
        auto* in = request.add_inputs();
        in->set_name("x");
        in->set_datatype("FP32");
        in->add_shape(8);
        in->add_shape(4);
        request.add_raw_input_contents(raw);
        inference::ModelInferResponse by_grpc;
        if (!Infer(request, &by_grpc).ok()) {
          ++failures;
          continue;
        }
        const std::string header =
            R"({"inputs":[{"name":"x","shape":[8,4],"datatype":"FP32",)"
            R"("parameters":{"binary_data_size":128}}],"parameters":{"binary_data_output":true}})";
        httplib::Headers headers = {{"Inference-Header-Content-Length", std::to_string(header.size())}};
        httplib::Result by_http =
            http.Post("/v2/models/mlp/infer", headers, header + raw, "application/octet-stream");
        if (!by_http || by_http->status != 200) {
          ++failures;
          continue;
        }
        const size_t json_length =
            std::stoul(by_http->get_header_value("Inference-Header-Content-Length"));
        if (by_http->body.substr(json_length) != by_grpc.raw_output_contents(0)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(ServerTest, AcceptsTypedContents) {
  ReferenceCall ref = Reference("mlp", "batch8");
  inference::ModelInferRequest request = RequestFor("mlp", ref);
  request.clear_raw_input_contents();
  const at::Tensor& x = ref.tensors[0];
  for (int64_t i = 0; i < x.numel(); ++i) {
    request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(
        x.data_ptr<float>()[i]);
  }
  inference::ModelInferResponse response;
  ASSERT_TRUE(Infer(request, &response).ok());
  EXPECT_TRUE(at::allclose(OutputTensor(response, 0), ref.expected[0], 1e-4, 1e-5));
}

TEST_F(ServerTest, ServesAFlaggedMissEagerlyWithASingleWarning) {
  EXPECT_EQ(Outcome(InferAndCompare("branch", "unchecked")), "variant");
  EXPECT_EQ(Outcome(InferAndCompare("branch", "checked")), "eager_fallback");
  EXPECT_EQ(Outcome(InferAndCompare("branch", "checked")), "eager_fallback");

  grpc::ClientContext context;
  precompile::v1::ModelRequest request;
  request.set_name("branch");
  precompile::v1::WarningsResponse warnings;
  ASSERT_TRUE(admin_->ListWarnings(&context, request, &warnings).ok());
  ASSERT_EQ(warnings.warnings_size(), 1);
  EXPECT_EQ(warnings.warnings(0).frame(), "forward");
  EXPECT_THAT(warnings.warnings(0).message(),
              AllOf(HasSubstr("check: expected False, got True"),
                    HasSubstr("will not report this miss")));

  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics,
                        "precompile_eager_fallback_warnings_total{frame=\"forward\","
                        "model=\"branch\",version=\"1\"}"),
            1);
  EXPECT_EQ(MetricValue(metrics,
                        "precompile_frame_calls_total{frame=\"forward\",model=\"branch\","
                        "outcome=\"eager_fallback\",version=\"1\"}"),
            2);
  EXPECT_EQ(MetricValue(metrics,
                        "precompile_requests_total{model=\"branch\",outcome=\"eager_fallback\","
                        "version=\"1\"}"),
            2);
}

TEST_F(ServerTest, RefusesAnUnflaggedMissWithTheRuntimesExplanation) {
  inference::ModelInferResponse response;
  grpc::Status status = Infer(RequestFor("mlp", Reference("mlp", "batch1")), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("no captured variant matches this call of frame 'forward'"),
                    HasSubstr("x.size(0)")));
  EXPECT_GE(MetricValue(Metrics(), "precompile_requests_total{model=\"mlp\",outcome=\"refused\","
                                   "version=\"1\"}"),
            1);
  InferAndCompare("mlp", "batch8");  // still serving
}

TEST_F(ServerTest, ACalleesRefusalNamesTheCallee) {
  EXPECT_EQ(Outcome(InferAndCompare("nested", "k1")), "eager_fallback");
  inference::ModelInferResponse response;
  grpc::Status status = Infer(RequestFor("nested", Reference("nested", "wide_k1")), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              HasSubstr("no captured variant matches this call of frame 'encoder'"));

  grpc::ClientContext context;
  precompile::v1::ModelRequest request;
  request.set_name("nested");
  precompile::v1::CoverageResponse coverage;
  ASSERT_TRUE(admin_->GetCoverage(&context, request, &coverage).ok());
  bool saw_encoder = false;
  for (const auto& frame : coverage.frames()) {
    if (frame.frame() != "encoder") continue;
    saw_encoder = true;
    EXPECT_GE(frame.variant_calls(), 1u);
    EXPECT_EQ(frame.refused_calls(), 1u);
    EXPECT_GE(frame.variant_hits().at("encoder#0"), 1u);
  }
  EXPECT_TRUE(saw_encoder);
}

TEST_F(ServerTest, LeavesArgumentsToTheirDefaults) {
  ReferenceCall ref = Reference("loop", "n0");
  inference::ModelInferRequest request = RequestFor("loop", ref);
  request.clear_parameters();  // n left to its recorded default, 0
  inference::ModelInferResponse response;
  ASSERT_TRUE(Infer(request, &response).ok());
  EXPECT_EQ(Variant(response), "forward#0");
  EXPECT_TRUE(at::allclose(OutputTensor(response, 0), ref.expected[0], 1e-4, 1e-5));
}

TEST_F(ServerTest, RejectsMalformedRequestsAndKeepsServing) {
  const ReferenceCall ref = Reference("loop", "n1");
  struct Case {
    std::string what;
    std::function<void(inference::ModelInferRequest&)> edit;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"unknown model", [](auto& r) { r.set_model_name("nope"); }, grpc::StatusCode::NOT_FOUND,
       "unknown model 'nope'"},
      {"unknown version", [](auto& r) { r.set_model_version("7"); }, grpc::StatusCode::NOT_FOUND,
       "version '7' of model 'loop' is not served"},
      {"bad datatype", [](auto& r) { r.mutable_inputs(0)->set_datatype("FP8"); },
       grpc::StatusCode::INVALID_ARGUMENT, "datatype 'FP8'"},
      // KServe datatypes torch has no dtype for.
      {"UINT16", [](auto& r) { r.mutable_inputs(0)->set_datatype("UINT16"); },
       grpc::StatusCode::INVALID_ARGUMENT, "datatype 'UINT16'"},
      {"UINT64", [](auto& r) { r.mutable_inputs(0)->set_datatype("UINT64"); },
       grpc::StatusCode::INVALID_ARGUMENT, "datatype 'UINT64'"},
      {"BYTES", [](auto& r) { r.mutable_inputs(0)->set_datatype("BYTES"); },
       grpc::StatusCode::INVALID_ARGUMENT, "datatype 'BYTES'"},
      {"shape and bytes disagree", [](auto& r) { r.mutable_inputs(0)->set_shape(0, 9); },
       grpc::StatusCode::INVALID_ARGUMENT, "has 128 bytes but shape [9, 4] of FP32 needs 144"},
      {"negative dimension", [](auto& r) { r.mutable_inputs(0)->set_shape(0, -8); },
       grpc::StatusCode::INVALID_ARGUMENT, "negative dimension"},
      {"enormous shape",
       [](auto& r) {
         r.mutable_inputs(0)->set_shape(0, int64_t{1} << 40);
         r.mutable_inputs(0)->set_shape(1, int64_t{1} << 40);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "more elements than any request can carry"},
      {"unknown input", [](auto& r) { r.mutable_inputs(0)->set_name("y"); },
       grpc::StatusCode::INVALID_ARGUMENT, "has no input 'y'"},
      {"missing input",
       [](auto& r) {
         r.clear_inputs();
         r.clear_raw_input_contents();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "missing argument 'x'"},
      {"duplicated input",
       [](auto& r) {
         *r.add_inputs() = r.inputs(0);
         r.add_raw_input_contents(r.raw_input_contents(0));
       },
       grpc::StatusCode::INVALID_ARGUMENT, "input 'x' appears more than once"},
      {"raw contents missing for an input", [](auto& r) { r.add_raw_input_contents("x"); },
       grpc::StatusCode::INVALID_ARGUMENT, "raw_input_contents"},
      {"wrong parameter type",
       [](auto& r) { (*r.mutable_parameters())["n"].set_string_param("one"); },
       grpc::StatusCode::INVALID_ARGUMENT, "argument 'n' must be an int, got a string"},
      {"unknown parameter",
       [](auto& r) { (*r.mutable_parameters())["bogus"].set_bool_param(true); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "has no argument 'bogus' (its arguments: n): a served model takes the arguments its example "
       "calls passed"},
      {"tensor as parameter", [](auto& r) { (*r.mutable_parameters())["x"].set_int64_param(1); },
       grpc::StatusCode::INVALID_ARGUMENT, "argument 'x' is a tensor"},
      {"unknown output", [](auto& r) { r.add_outputs()->set_name("logits"); },
       grpc::StatusCode::INVALID_ARGUMENT, "has no output 'logits'"},
  };
  for (const Case& c : cases) {
    inference::ModelInferRequest request = RequestFor("loop", ref);
    c.edit(request);
    inference::ModelInferResponse response;
    grpc::Status status = Infer(request, &response);
    EXPECT_EQ(status.error_code(), c.code) << c.what << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(Outcome(InferAndCompare("loop", "n1")), "eager_fallback");
}

TEST_F(ServerTest, RefusesBytesThatAreNotARequestAndKeepsServing) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  // A varint that never ends.
  grpc::Slice garbage(std::string("\x0a\xff\xff\xff\xff"));
  grpc::ByteBuffer request(&garbage, 1);
  auto call = generic.PrepareUnaryCall(&context, "/inference.GRPCInferenceService/ModelInfer",
                                       request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, &cq);
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("not a ModelInferRequest"));
  EXPECT_EQ(Outcome(InferAndCompare("mlp", "batch8")), "variant");
}

TEST_F(ServerTest, SendsLargeOutputsIntact) {
  // 1024 rows: a [1024, 3] FP32 output, large enough to be sent from the
  // output tensor itself rather than copied (server/grpc/infer_response.h).
  const ReferenceCall ref = Reference("mlp", "batch8");
  const at::Tensor x = ref.tensors[0].repeat({128, 1}).contiguous();
  inference::ModelInferRequest request = RequestFor("mlp", ref);
  request.mutable_inputs(0)->set_shape(0, 1024);
  request.set_raw_input_contents(0, std::string(static_cast<const char*>(x.data_ptr()),
                                                x.nbytes()));
  inference::ModelInferResponse response;
  grpc::Status status = Infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  EXPECT_GE(response.raw_output_contents(0).size(), server::kReferencedOutputBytes);
  // The rows of an MLP are independent: 128 copies of the batch of 8.
  EXPECT_TRUE(
      at::allclose(OutputTensor(response, 0), ref.expected[0].repeat({128, 1}), 1e-4, 1e-5));
}

// Puts a tensor's values in the typed contents field KServe has for its dtype.
void SetTypedContents(const at::Tensor& t, inference::InferTensorContents* contents) {
  const at::Tensor flat = t.flatten();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    switch (t.scalar_type()) {
      case at::kBool: contents->add_bool_contents(flat[i].item<bool>()); break;
      case at::kByte: contents->add_uint_contents(flat[i].item<uint8_t>()); break;
      case at::kChar:
      case at::kShort:
      case at::kInt: contents->add_int_contents(flat[i].item<int32_t>()); break;
      case at::kLong: contents->add_int64_contents(flat[i].item<int64_t>()); break;
      case at::kFloat: contents->add_fp32_contents(flat[i].item<float>()); break;
      case at::kDouble: contents->add_fp64_contents(flat[i].item<double>()); break;
      default: ADD_FAILURE() << "no typed contents for " << t.scalar_type();
    }
  }
}

TEST_F(ServerTest, ServesEveryDtypeInAndOutRawOrTyped) {
  const ReferenceCall ref = Reference("dtypes", "each");
  // The model's outputs, in order, keep the dtypes of f16, bf16, f32, f64,
  // u8, i8, i16, i32, i64 and b.
  const std::vector<std::string> datatypes = {"FP16", "BF16", "FP32",  "FP64",  "UINT8",
                                              "INT8", "INT16", "INT32", "INT64", "BOOL"};
  const std::map<std::string, std::string> datatype_of_input = {
      {"f16", "FP16"}, {"bf16", "BF16"}, {"f32", "FP32"},   {"f64", "FP64"},   {"u8", "UINT8"},
      {"i8", "INT8"},  {"i16", "INT16"}, {"i32", "INT32"}, {"i64", "INT64"}, {"b", "BOOL"}};
  for (bool typed : {false, true}) {
    inference::ModelInferRequest request = RequestFor("dtypes", ref);
    ASSERT_EQ(request.inputs_size(), static_cast<int>(datatypes.size()));
    for (const auto& input : request.inputs()) {
      EXPECT_EQ(input.datatype(), datatype_of_input.at(input.name()));
    }
    if (typed) {
      // Raw contents are all or nothing, and FP16 and BF16 have no typed
      // field: typed contents for every other dtype leave FP16 with none.
      for (int i = 0; i < request.inputs_size(); ++i) {
        if (request.inputs(i).datatype() == "FP16" || request.inputs(i).datatype() == "BF16") {
          continue;
        }
        SetTypedContents(ref.tensors[i], request.mutable_inputs(i)->mutable_contents());
      }
      request.clear_raw_input_contents();
      inference::ModelInferResponse refused;
      grpc::Status status = Infer(request, &refused);
      ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(status.error_message(), HasSubstr("which travels only in raw_input_contents"));
      continue;
    }
    inference::ModelInferResponse response;
    grpc::Status status = Infer(request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.outputs_size(), static_cast<int>(datatypes.size()));
    for (int i = 0; i < response.outputs_size(); ++i) {
      EXPECT_EQ(response.outputs(i).datatype(), datatypes[i]) << i;
      const at::Tensor got = OutputTensor(response, i);
      EXPECT_EQ(got.scalar_type(), ref.expected[i].scalar_type()) << datatypes[i];
      if (got.is_floating_point()) {
        EXPECT_TRUE(at::allclose(got.to(at::kDouble), ref.expected[i].to(at::kDouble), 1e-2, 1e-2))
            << datatypes[i];
      } else {
        EXPECT_TRUE(at::equal(got, ref.expected[i])) << datatypes[i];
      }
    }
  }
}

TEST_F(ServerTest, OutputsThatShareTheRequestsMemoryOutliveTheRequest) {
  // The input itself and a view of its first half, both large enough to be
  // sent by reference: sent from the request's bytes, they would be read
  // after the request is gone (AddressSanitizer: heap-use-after-free).
  const ReferenceCall ref = Reference("passthrough", "rows1024");
  for (int round = 0; round < 3; ++round) {
    inference::ModelInferResponse response;
    grpc::Status status = Infer(RequestFor("passthrough", ref), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.raw_output_contents_size(), 3);
    EXPECT_GE(response.raw_output_contents(1).size(), server::kReferencedOutputBytes);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(at::equal(OutputTensor(response, i), ref.expected[i])) << "output" << i;
    }
  }
}

TEST_F(ServerTest, PassesNanAndInfThroughLikeTheModelWould) {
  ReferenceCall ref = Reference("loop", "n0");
  at::Tensor x = ref.tensors[0].clone();
  x[0][0] = std::numeric_limits<float>::quiet_NaN();
  x[0][1] = std::numeric_limits<float>::infinity();
  inference::ModelInferRequest request = RequestFor("loop", ref);
  request.set_raw_input_contents(0, std::string(static_cast<const char*>(x.data_ptr()),
                                                x.nbytes()));
  inference::ModelInferResponse response;
  ASSERT_TRUE(Infer(request, &response).ok());
  at::Tensor y = OutputTensor(response, 0);
  EXPECT_TRUE(std::isnan(y[0][0].item<float>()));
  EXPECT_TRUE(std::isnan(y[0][1].item<float>()));  // sin(inf)
  EXPECT_TRUE(at::allclose(y.slice(0, 1), ref.expected[0].slice(0, 1), 1e-4, 1e-5));
}

TEST_F(ServerTest, ReportsSummaryFramesAndStatistics) {
  grpc::ClientContext c1;
  precompile::v1::ModelRequest request;
  request.set_name("loop");
  precompile::v1::SummaryResponse summary;
  ASSERT_TRUE(admin_->GetSummary(&c1, request, &summary).ok());
  EXPECT_TRUE(summary.complete());
  EXPECT_THAT(summary.eager_fallbacks(), ElementsAre(HasSubstr("forward")));
  EXPECT_TRUE(summary.uncovered_frames().empty());
  EXPECT_EQ(summary.entry_frame(), "forward");

  grpc::ClientContext c2;
  precompile::v1::FramesResponse frames;
  ASSERT_TRUE(admin_->GetFrames(&c2, request, &frames).ok());
  EXPECT_THAT(frames.frames(), HasSubstr("# eager fallback"));

  InferAndCompare("loop", "n0");
  grpc::ClientContext c3;
  inference::ModelStatisticsRequest stats_request;
  stats_request.set_name("loop");
  inference::ModelStatisticsResponse stats;
  ASSERT_TRUE(inference_->ModelStatistics(&c3, stats_request, &stats).ok());
  ASSERT_EQ(stats.model_stats_size(), 1);
  EXPECT_GE(stats.model_stats(0).inference_stats().success().count(), 1u);
  EXPECT_GT(stats.model_stats(0).inference_stats().compute_infer().ns(), 0u);
  EXPECT_GT(stats.model_stats(0).last_inference(), 0u);

  const std::string metrics = Metrics();
  EXPECT_EQ(MetricValue(metrics, "precompile_model_complete{model=\"loop\",version=\"1\"}"), 1);
  EXPECT_EQ(MetricValue(metrics,
                        "precompile_model_eager_fallback_frames{model=\"loop\",version=\"1\"}"),
            1);
  EXPECT_EQ(MetricValue(metrics, "precompile_model_variants{model=\"nested\",version=\"1\"}"), 3);
  EXPECT_EQ(MetricValue(metrics, "precompile_models_loaded"), 6);
  EXPECT_THAT(metrics, HasSubstr("precompile_request_duration_seconds_bucket{model=\"loop\","));
  EXPECT_THAT(metrics, HasSubstr("precompile_guard_dispatch_duration_seconds_bucket{frame="));
}

// Server reflection, asked as grpcurl asks it: what the server offers, and
// the descriptors of a service's file and of every file it imports, so that
// a client can build its requests with nothing else.
TEST_F(ServerTest, DescribesItsServicesThroughReflection) {
  using ::grpc::reflection::v1alpha::ServerReflection;
  using ::grpc::reflection::v1alpha::ServerReflectionRequest;
  using ::grpc::reflection::v1alpha::ServerReflectionResponse;
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = ServerReflection::NewStub(channel);
  grpc::ClientContext context;
  auto stream = stub->ServerReflectionInfo(&context);
  auto ask = [&](const ServerReflectionRequest& request) {
    EXPECT_TRUE(stream->Write(request));
    ServerReflectionResponse response;
    EXPECT_TRUE(stream->Read(&response));
    return response;
  };
  auto files = [](const ServerReflectionResponse& response) {
    std::vector<google::protobuf::FileDescriptorProto> files;
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      files.emplace_back().ParseFromString(bytes);
    }
    return files;
  };

  ServerReflectionRequest request;
  request.set_list_services("");
  std::vector<std::string> services;
  const ServerReflectionResponse listed = ask(request);
  for (const auto& service : listed.list_services_response().service()) {
    services.push_back(service.name());
  }
  EXPECT_THAT(services, ElementsAre("inference.GRPCInferenceService", "precompile.v1.PrecompileAdmin",
                                    "grpc.health.v1.Health",
                                    "grpc.reflection.v1alpha.ServerReflection"));

  // A method's file comes with the files it imports, each once.
  request.set_file_containing_symbol("inference.GRPCInferenceService.ModelInfer");
  std::vector<google::protobuf::FileDescriptorProto> inference = files(ask(request));
  ASSERT_EQ(inference.size(), 2u);
  EXPECT_EQ(inference[0].name(), "proto/inference.proto");
  ASSERT_EQ(inference[0].service_size(), 1);
  EXPECT_EQ(inference[0].service(0).name(), "GRPCInferenceService");
  EXPECT_EQ(inference[1].name(), "proto/model_config.proto");

  for (const std::string& service : services) {
    request.set_file_containing_symbol(service);
    EXPECT_FALSE(files(ask(request)).empty()) << service;
  }
  request.set_file_by_filename("proto/admin.proto");
  std::vector<google::protobuf::FileDescriptorProto> admin = files(ask(request));
  ASSERT_FALSE(admin.empty());
  EXPECT_EQ(admin[0].name(), "proto/admin.proto");

  request.set_file_containing_symbol("inference.NoSuchService");
  ServerReflectionResponse unknown = ask(request);
  EXPECT_EQ(unknown.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_response().error_message(), HasSubstr("inference.NoSuchService"));
  EXPECT_EQ(unknown.original_request().file_containing_symbol(), "inference.NoSuchService");

  // Names are short: a request of megabytes is refused, not echoed back.
  request.set_file_containing_symbol(std::string(1 << 20, 'x'));
  ServerReflectionResponse large = ask(request);
  EXPECT_EQ(large.error_response().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(large.has_original_request());

  // The stream answers after a refusal, and ends when the client ends it.
  request.set_file_by_filename("proto/health.proto");
  EXPECT_EQ(files(ask(request)).size(), 1u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace precompile
