#include "tests/testing/test_server.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/reference.h"

namespace precompile::client::testing {

server::Server* ExampleServerTest::server_ = nullptr;

std::unique_ptr<server::Server> StartExampleServer(
    const std::function<void(server::ServerOptions&)>& configure) {
  server::ServerOptions options;
  options.model_repository = precompile::testing::ExampleRepository({"mlp", "loop"});
  options.grpc_address = "127.0.0.1:0";
  // No metrics: the clients do not read them, and stopping the metrics HTTP
  // server costs each server about 2 s.
  options.metrics_address = "";
  options.drain_timeout = absl::Seconds(5);
  // The client tools' tests load, unload and rescan without a token; the
  // refusal without one is tested in tests/server_repository_test.cc.
  options.allow_unauthenticated_control = true;
  if (configure) configure(options);
  absl::StatusOr<std::unique_ptr<server::Server>> server = server::Server::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  return *std::move(server);
}

std::string AddressOf(const server::Server& server) {
  return absl::StrCat("127.0.0.1:", server.grpc_port());
}

std::vector<Tensor> ReferenceInputs(const std::string& model, const std::string& call) {
  precompile::testing::ReferenceCall ref = precompile::testing::Reference(model, call);
  std::vector<Tensor> inputs;
  for (const NamedValue& arg : ref.args) {
    const auto* t = std::get_if<TensorArg>(&arg.value);
    if (t == nullptr) continue;
    EXPECT_EQ(t->dtype, DType::kFloat32);
    Tensor tensor;
    tensor.name = arg.name;
    tensor.datatype = "FP32";
    tensor.shape = t->shape;
    tensor.data.assign(static_cast<const char*>(t->data), t->nbytes);
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

std::map<std::string, ScalarValue> ReferenceScalars(const std::string& model,
                                                    const std::string& call) {
  precompile::testing::ReferenceCall ref = precompile::testing::Reference(model, call);
  std::map<std::string, ScalarValue> scalars;
  for (const NamedValue& arg : ref.args) {
    if (const auto* b = std::get_if<bool>(&arg.value)) scalars[arg.name] = *b;
    if (const auto* i = std::get_if<int64_t>(&arg.value)) scalars[arg.name] = *i;
    if (const auto* d = std::get_if<double>(&arg.value)) scalars[arg.name] = *d;
  }
  return scalars;
}

std::vector<float> ReferenceOutput(const std::string& model, const std::string& call, int index) {
  precompile::testing::ReferenceCall ref = precompile::testing::Reference(model, call);
  const at::Tensor expected = ref.expected.at(index).contiguous().to(at::kFloat);
  const float* data = expected.data_ptr<float>();
  return std::vector<float>(data, data + expected.numel());
}

std::vector<int64_t> ReferenceOutputShape(const std::string& model, const std::string& call,
                                          int index) {
  precompile::testing::ReferenceCall ref = precompile::testing::Reference(model, call);
  const auto sizes = ref.expected.at(index).sizes();
  return std::vector<int64_t>(sizes.begin(), sizes.end());
}

std::string CompareFloats(const std::vector<float>& actual, const std::vector<float>& expected,
                          double rtol, double atol) {
  if (actual.size() != expected.size()) {
    return absl::StrCat(actual.size(), " values, expected ", expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!(std::fabs(actual[i] - expected[i]) <= atol + rtol * std::fabs(expected[i]))) {
      return absl::StrCat("value ", i, " is ", actual[i], ", expected ", expected[i]);
    }
  }
  return "";
}

std::vector<float> FloatsOf(const Tensor& tensor) {
  EXPECT_EQ(tensor.datatype, "FP32");
  std::vector<float> values(tensor.data.size() / sizeof(float));
  std::memcpy(values.data(), tensor.data.data(), values.size() * sizeof(float));
  return values;
}

std::string TestCertificate(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "precompile_serve",
                      "/tests/testing/testdata/", name);
}

std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::string path =
      absl::StrCat(precompile::testing::NewTempDirectory("client-test"), "/", name);
  std::ofstream out(path, std::ios::binary);
  out << contents;
  EXPECT_TRUE(out.good()) << path;
  return path;
}

}  // namespace precompile::client::testing
