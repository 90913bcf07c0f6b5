// Inference requests the server tests send to the example models.
#ifndef PRECOMPILE_TESTS_TESTING_REQUESTS_H_
#define PRECOMPILE_TESTS_TESTING_REQUESTS_H_

#include <cstdint>
#include <initializer_list>
#include <string>

#include "proto/inference.pb.h"

namespace precompile::testing {

// A request for `model` whose tensor argument x is a float32 of zeros, 8x4
// unless `shape` says otherwise.
inline inference::ModelInferRequest ZerosRequest(
    const std::string& model, std::initializer_list<int64_t> shape = {8, 4}) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  auto* input = request.add_inputs();
  input->set_name("x");
  input->set_datatype("FP32");
  int64_t elements = 1;
  for (int64_t d : shape) {
    input->add_shape(d);
    elements *= d;
  }
  request.add_raw_input_contents(std::string(elements * sizeof(float), '\0'));
  return request;
}

// A loop call with `n` eager iterations: with n in the hundreds of
// thousands, slow enough (a second or more) to be in flight when a test acts.
inline inference::ModelInferRequest SlowLoopRequest(int64_t n) {
  inference::ModelInferRequest request = ZerosRequest("loop");
  (*request.mutable_parameters())["n"].set_int64_param(n);
  return request;
}

// A loop call that runs until its client cancels it (the server polls for
// that at every iteration): a test ends it when it has seen what it wanted,
// instead of waiting for a loop long enough for a slow machine.
inline inference::ModelInferRequest EndlessLoopRequest() {
  return SlowLoopRequest(int64_t{1000000000000});
}

}  // namespace precompile::testing

#endif  // PRECOMPILE_TESTS_TESTING_REQUESTS_H_
