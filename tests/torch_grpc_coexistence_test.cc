// Proves that the wheel's libtorch and Debian's gRPC/protobuf live in one
// process: a real gRPC server on loopback whose handler runs a torch
// operation, called by a real client. If the two disagreed on headers (torch
// ships protobuf 3.13 and fmt headers) or symbols, this would fail to build,
// link or give the wrong numbers.
#include <ATen/ops/from_blob.h>
#include <ATen/ops/matmul.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "proto/inference.grpc.pb.h"

namespace {

class MatmulService final : public inference::GRPCInferenceService::Service {
  grpc::Status ModelInfer(grpc::ServerContext*,
                          const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override {
    const std::string& raw = request->raw_input_contents(0);
    std::vector<int64_t> shape(request->inputs(0).shape().begin(),
                               request->inputs(0).shape().end());
    at::Tensor x =
        at::from_blob(const_cast<char*>(raw.data()), shape, at::kFloat).clone();
    at::Tensor y = at::matmul(x, x.t()).contiguous();
    auto* out = response->add_outputs();
    out->set_name("y");
    out->set_datatype("FP32");
    for (int64_t d : y.sizes()) out->add_shape(d);
    response->add_raw_output_contents(
        std::string(static_cast<const char*>(y.data_ptr()), y.nbytes()));
    return grpc::Status::OK;
  }
};

TEST(TorchGrpcCoexistence, HandlerRunsTorchOverLoopback) {
  MatmulService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  auto stub = inference::GRPCInferenceService::NewStub(channel);

  const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // 2x3
  inference::ModelInferRequest request;
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  input->add_shape(2);
  input->add_shape(3);
  request.add_raw_input_contents(
      std::string(reinterpret_cast<const char*>(x.data()), x.size() * 4));

  inference::ModelInferResponse response;
  grpc::ClientContext context;
  grpc::Status status = stub->ModelInfer(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();

  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).shape_size(), 2);
  const std::string& raw = response.raw_output_contents(0);
  ASSERT_EQ(raw.size(), 4 * sizeof(float));
  float y[4];
  std::memcpy(y, raw.data(), sizeof(y));
  // x @ x.T = [[14, 32], [32, 77]]
  EXPECT_FLOAT_EQ(y[0], 14);
  EXPECT_FLOAT_EQ(y[1], 32);
  EXPECT_FLOAT_EQ(y[2], 32);
  EXPECT_FLOAT_EQ(y[3], 77);
  server->Shutdown();
}

}  // namespace
