// Binding a call's arguments and keeping its outputs, on a frame described
// by hand: no artifact, no compiled code.
#include "runtime/call_binding.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/cuda_support.h"

namespace precompile {
namespace {

using artifact::v1::Frame;
using artifact::v1::Parameter;
using ::testing::HasSubstr;

// forward(x: Tensor, ids: Tensor (indices into a table of 10), n: int = 3)
Frame ForwardFrame() {
  Frame frame;
  frame.set_name("forward");
  Parameter* x = frame.add_parameters();
  x->set_name("x");
  x->set_kind(Parameter::TENSOR);
  Parameter* ids = frame.add_parameters();
  ids->set_name("ids");
  ids->set_kind(Parameter::TENSOR);
  ids->mutable_index_range()->set_min(0);
  ids->mutable_index_range()->set_max(10);
  Parameter* n = frame.add_parameters();
  n->set_name("n");
  n->set_kind(Parameter::INT);
  n->mutable_default_value()->set_int_value(3);
  return frame;
}

TensorArg Tensor(DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes) {
  TensorArg t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

struct Arguments {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<int64_t> ids = {0, 9};
  std::vector<NamedValue> Named() const {
    return {{"ids", Tensor(DType::kInt64, {2}, ids.data(), ids.size() * 8)},
            {"x", Tensor(DType::kFloat32, {2, 2}, x.data(), x.size() * 4)}};
  }
};

TEST(BindArguments, BindsByNameFillsDefaultsAndWrapsWithoutCopying) {
  const Arguments a;
  absl::StatusOr<BoundArguments> bound =
      BindArguments(ForwardFrame(), "m", a.Named(), DeviceType::kCpu);
  ASSERT_TRUE(bound.ok()) << bound.status();
  ASSERT_EQ(bound->positional.size(), 3u);
  EXPECT_EQ(bound->positional[0].toTensor().data_ptr(), a.x.data());
  EXPECT_EQ(bound->positional[0].toTensor().sizes(), at::IntArrayRef({2, 2}));
  EXPECT_EQ(bound->positional[1].toTensor().data_ptr(), a.ids.data());
  EXPECT_EQ(bound->positional[2].toInt(), 3);
  EXPECT_EQ(bound->request_tensors.size(), 2u);
}

TEST(BindArguments, RefusesEachBadArgumentNamingIt) {
  const Arguments a;
  const Frame frame = ForwardFrame();
  auto refusal = [&](std::vector<NamedValue> args) {
    absl::StatusOr<BoundArguments> bound = BindArguments(frame, "m", args, DeviceType::kCpu);
    EXPECT_EQ(bound.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(bound.status().message());
  };
  std::vector<NamedValue> args = a.Named();
  args.push_back({"y", int64_t{1}});
  EXPECT_THAT(refusal(args), HasSubstr("model 'm' has no argument 'y' (its arguments: x, ids, n)"));
  args = a.Named();
  args.push_back({"x", args[1].value});
  EXPECT_THAT(refusal(args), HasSubstr("argument 'x' is given more than once"));
  EXPECT_THAT(refusal({a.Named()[1]}), HasSubstr("missing argument 'ids' of model 'm'"));
  args = a.Named();
  args.push_back({"n", a.Named()[1].value});
  EXPECT_THAT(refusal(args), HasSubstr("argument 'n' must be an int, got a tensor"));
  args = a.Named();
  std::get<TensorArg>(args[1].value).nbytes = 12;
  EXPECT_THAT(refusal(args), HasSubstr("argument 'x' has 12 bytes but its shape [2, 2] of float32 needs 16"));
  args = a.Named();
  std::get<TensorArg>(args[1].value).shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THAT(refusal(args), HasSubstr("argument 'x' has shape [1099511627776, 1099511627776], "
                                       "more elements than any request can carry"));
  // Empty, with strides past 2^64 all the same.
  args = a.Named();
  std::get<TensorArg>(args[1].value).shape = {0, int64_t{1} << 62};
  std::get<TensorArg>(args[1].value).nbytes = 0;
  EXPECT_THAT(refusal(args), HasSubstr("argument 'x' has shape [0, 4611686018427387904], more "
                                       "elements than any request can carry"));
  const std::vector<int64_t> outside = {3, 10};
  args = a.Named();
  args[0].value = Tensor(DType::kInt64, {2}, outside.data(), 16);
  EXPECT_THAT(refusal(args),
              HasSubstr("argument 'ids' holds 10 at flat index 1; each value must be in [0, 10), "
                        "the range in which the capture proved the model's table lookups stay in "
                        "bounds"));
  // Device memory (a sequence's state a CUDA call left there) is for a
  // model on that device only: read as host memory it would crash.
  args = a.Named();
  std::get<TensorArg>(args[1].value).device = DeviceType::kCuda;
  EXPECT_THAT(refusal(args), HasSubstr("argument 'x' is in cuda memory but model 'm' runs on cpu"));
}

// A sequence's state on CUDA: what is marked stays in device memory, in
// its own storage; the rest comes to the host. And back as an argument, it
// is the same memory, not a copy.
TEST(HostOutputs, LeavesMarkedCudaOutputsOnTheDevice) {
  if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) GTEST_SKIP() << cuda;
  const at::Tensor base = at::arange(8, at::kFloat).cuda();
  const std::vector<bool> on_device = {true, false, true};
  absl::StatusOr<std::vector<OutputTensor>> outputs =
      HostOutputs({base.slice(0, 0, 4), base, at::ones({3}, at::kLong)}, {}, &on_device);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  EXPECT_EQ((*outputs)[0].device, DeviceType::kCuda);
  EXPECT_NE((*outputs)[0].data, base.data_ptr());  // A part of a larger tensor: copied out.
  EXPECT_EQ((*outputs)[0].nbytes, 16u);
  EXPECT_EQ((*outputs)[1].device, DeviceType::kCpu);
  EXPECT_EQ(static_cast<const float*>((*outputs)[1].data)[7], 7.0f);
  // Marked but computed on the host (an eager program's): stays there.
  EXPECT_EQ((*outputs)[2].device, DeviceType::kCpu);

  Frame frame;
  frame.set_name("forward");
  Parameter* past = frame.add_parameters();
  past->set_name("past");
  past->set_kind(Parameter::TENSOR);
  TensorArg state = Tensor(DType::kFloat32, {4}, (*outputs)[0].data, 16);
  state.device = DeviceType::kCuda;
  absl::StatusOr<BoundArguments> bound =
      BindArguments(frame, "m", {{"past", state}}, DeviceType::kCuda);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_TRUE(bound->positional[0].toTensor().is_cuda());
  EXPECT_EQ(bound->positional[0].toTensor().data_ptr(), (*outputs)[0].data);
}

// Through pinned buffers: a request tensor reaches the device with its
// values even when the caller's buffer changes as soon as binding returns,
// and outputs come back whole, the one wait for the stream done before they
// are read, into memory the caller keeps (not pinned: it is not counted,
// and cannot be paged out).
TEST(CudaCopies, PinnedBuffersCarryRequestsAndOutputsWhole) {
  if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) GTEST_SKIP() << cuda;
  Frame frame;
  frame.set_name("forward");
  Parameter* x = frame.add_parameters();
  x->set_name("x");
  x->set_kind(Parameter::TENSOR);
  std::vector<float> request(1 << 20);
  for (size_t i = 0; i < request.size(); ++i) request[i] = static_cast<float>(i % 1000);
  absl::StatusOr<BoundArguments> bound = BindArguments(
      frame, "m", {{"x", Tensor(DType::kFloat32, {1 << 20}, request.data(), 4 << 20)}},
      DeviceType::kCuda, CudaCopies::kPinned);
  ASSERT_TRUE(bound.ok()) << bound.status();
  std::fill(request.begin(), request.end(), -1.0f);
  const at::Tensor on_device = bound->positional[0].toTensor();
  ASSERT_TRUE(on_device.is_cuda());
  // Work queued after the copy on the same stream, as a model's is.
  const at::Tensor doubled = on_device.mul(2);
  const at::Tensor transposed = at::arange(12, at::kFloat).cuda().reshape({3, 4}).t();
  absl::StatusOr<std::vector<OutputTensor>> outputs =
      HostOutputs({doubled, transposed}, bound->request_tensors, nullptr, CudaCopies::kPinned);
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const OutputTensor& first = (*outputs)[0];
  EXPECT_EQ(first.device, DeviceType::kCpu);
  EXPECT_FALSE(at::detail::getCUDAHooks().isPinnedPtr(first.data));
  const float* values = static_cast<const float*>(first.data);
  for (size_t i = 0; i < request.size(); i += 4099) {
    ASSERT_EQ(values[i], 2.0f * static_cast<float>(i % 1000)) << "at " << i;
  }
  // A transposed output comes back contiguous, in its logical order.
  const OutputTensor& second = (*outputs)[1];
  EXPECT_EQ(second.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(static_cast<const float*>(second.data)[1], 4.0f);
  EXPECT_EQ(second.nbytes, 48u);
}

TEST(CheckIndexRanges, NamesTheFrameTheArgumentAndAValueOutside) {
  const Frame frame = ForwardFrame();
  std::vector<c10::IValue> args = {at::zeros({2, 2}), at::tensor({0, 9}), int64_t{3}};
  EXPECT_TRUE(CheckIndexRanges(frame, args).ok());
  args[1] = at::tensor({-1, 4});
  const absl::Status refused = CheckIndexRanges(frame, args);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("frame 'forward': argument 'ids' holds -1"));
}

TEST(HostOutputs, CopiesAnOutputThatAliasesARequestTensorAndKeepsOthers) {
  std::vector<float> request = {1, 2, 3, 4};
  const at::Tensor in = at::from_blob(request.data(), {2, 2});
  const at::Tensor own = at::ones({3});
  // A transposed view of the request: not contiguous, and aliasing it.
  absl::StatusOr<std::vector<OutputTensor>> outputs =
      HostOutputs({in.t(), own}, std::vector<at::Tensor>{in});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  ASSERT_EQ(outputs->size(), 2u);
  const OutputTensor& copied = (*outputs)[0];
  EXPECT_NE(copied.data, request.data());
  EXPECT_EQ(copied.shape, (std::vector<int64_t>{2, 2}));
  request[1] = 100;  // The caller keeps what it got, whatever the request does.
  EXPECT_EQ(static_cast<const float*>(copied.data)[2], 2.0f);
  EXPECT_EQ((*outputs)[1].data, own.data_ptr());
  EXPECT_EQ((*outputs)[1].nbytes, 12u);

  absl::StatusOr<std::vector<OutputTensor>> complex =
      HostOutputs({at::zeros({2}, at::kComplexFloat)}, {});
  EXPECT_EQ(complex.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(complex.status().message(), HasSubstr("cannot be returned"));
}

TEST(HostOutputs, APartOfALargerTensorKeepsOnlyItsOwnBytesAlive) {
  const at::Tensor whole = at::arange(1000, at::kFloat);
  // Contiguous, so contiguous() keeps the view and with it all 4000 bytes.
  at::Tensor part = whole.slice(0, 10, 14);
  ASSERT_TRUE(part.is_contiguous());
  absl::StatusOr<std::vector<OutputTensor>> outputs = HostOutputs({std::move(part)}, {});
  ASSERT_TRUE(outputs.ok()) << outputs.status();
  const OutputTensor& out = (*outputs)[0];
  EXPECT_EQ(out.nbytes, 16u);
  EXPECT_EQ(out.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(static_cast<const float*>(out.data)[0], 10.0f);
  EXPECT_EQ(static_cast<const float*>(out.data)[3], 13.0f);
  // Only `whole` holds its storage: the output owns a copy of its part.
  EXPECT_EQ(whole.storage().use_count(), 1u);
  EXPECT_NE(out.data, static_cast<const float*>(whole.data_ptr()) + 10);

  // A whole tensor is handed on as it is.
  const at::Tensor own = at::ones({3});
  absl::StatusOr<std::vector<OutputTensor>> kept = HostOutputs({own}, {});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)[0].data, own.data_ptr());
}

}  // namespace
}  // namespace precompile
