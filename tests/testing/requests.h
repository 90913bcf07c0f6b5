// Inference requests the server tests send to the example models.
#ifndef PRECOMPILE_TESTS_TESTING_REQUESTS_H_
#define PRECOMPILE_TESTS_TESTING_REQUESTS_H_

#include <cstdint>
#include <string>

#include "proto/inference.pb.h"

namespace precompile::testing {

// A request for `model` whose tensor argument x is an 8x4 float32 of zeros.
inline inference::ModelInferRequest ZerosRequest(const std::string& model) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  input->add_shape(8);
  input->add_shape(4);
  request.add_raw_input_contents(std::string(8 * 4 * sizeof(float), '\0'));
  return request;
}

// A loop call with `n` eager iterations: with n in the hundreds of
// thousands, slow enough (a second or more) to be in flight when a test acts.
inline inference::ModelInferRequest SlowLoopRequest(int64_t n) {
  inference::ModelInferRequest request = ZerosRequest("loop");
  (*request.mutable_parameters())["n"].set_int64_param(n);
  return request;
}

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_REQUESTS_H_
