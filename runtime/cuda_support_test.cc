// CUDA support is loaded on demand. Without a GPU, loading still finds and
// loads libtorch_cuda from the wheel and then says that no device is usable;
// with one, a CUDA tensor round-trips. CPU serving is unaffected either way.
#include "runtime/cuda_support.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mul.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "runtime/loaded_version.h"
#include "tests/testing/artifacts.h"
#include "tests/testing/reference.h"

namespace precompile {
namespace {

using ::testing::HasSubstr;

TEST(CudaSupport, LoadsOnDemandAndSaysWhetherADeviceIsUsable) {
  absl::Status status = LoadCudaSupport();
  // Idempotent: the second call gives the same answer.
  EXPECT_EQ(LoadCudaSupport().code(), status.code());
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("no CUDA device is usable"))
        << "libtorch_cuda itself should load from the wheel: " << status;
    EXPECT_FALSE(CudaAvailable());
    GTEST_SKIP() << "no GPU on this machine: " << status;
  }
  EXPECT_TRUE(CudaAvailable());
  at::Tensor x = at::arange(6, at::kFloat).cuda();
  EXPECT_TRUE(x.is_cuda());
  EXPECT_TRUE(at::equal(x.cpu(), at::arange(6, at::kFloat)));
  // Loaded after libtorch started, libtorch_cuda still gives it pinned
  // memory (what --cuda_pinned_staging copies through).
  EXPECT_TRUE(CheckPinnedMemory().ok()) << CheckPinnedMemory();
}

const c10::impl::DeviceGuardImplInterface& Cuda() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

// The stream current on this thread for CUDA device `index`.
c10::Stream CurrentStream(int index = 0) {
  return Cuda().getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

TEST(CudaCall, IsRefusedWithoutAUsableDevice) {
  if (LoadCudaSupport().ok()) GTEST_SKIP() << "a GPU is usable here";
  absl::StatusOr<std::unique_ptr<CudaCall>> call = CudaCall::Enter(-1, true);
  EXPECT_EQ(call.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(call.status().message(), HasSubstr("without a usable CUDA device"));
}

TEST(CudaCall, HasAStreamOfItsOwnUntilItGoes) {
  if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) GTEST_SKIP() << cuda;
  const c10::Stream before = CurrentStream();
  c10::Stream during = before;
  {
    absl::StatusOr<std::unique_ptr<CudaCall>> call = CudaCall::Enter(0, true);
    ASSERT_TRUE(call.ok()) << call.status();
    during = CurrentStream();
    EXPECT_NE(during, before);
    // Work queued on it is done once it is synchronised.
    at::Tensor x = at::mul(at::arange(1 << 20, at::kFloat).cuda(), 2);
    ASSERT_TRUE(SynchronizeCurrentStream(0).ok());
    EXPECT_TRUE(at::equal(x.cpu(), at::mul(at::arange(1 << 20, at::kFloat), 2)));
    // Another thread's call has a stream of its own.
    c10::Stream other = before;
    std::thread([&] {
      absl::StatusOr<std::unique_ptr<CudaCall>> theirs = CudaCall::Enter(0, true);
      ASSERT_TRUE(theirs.ok()) << theirs.status();
      other = CurrentStream();
    }).join();
    EXPECT_NE(other, during);
    EXPECT_NE(other, before);
  }
  EXPECT_EQ(CurrentStream(), before);
}

TEST(CudaCall, WithoutAStreamOfItsOwnKeepsTheThreadsStream) {
  if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) GTEST_SKIP() << cuda;
  const c10::Stream before = CurrentStream();
  absl::StatusOr<std::unique_ptr<CudaCall>> call = CudaCall::Enter(0, false);
  ASSERT_TRUE(call.ok()) << call.status();
  EXPECT_EQ(CurrentStream(), before);
}

TEST(CudaCall, MakesTheModelsDeviceCurrent) {
  if (absl::Status cuda = LoadCudaSupport(); !cuda.ok()) GTEST_SKIP() << cuda;
  if (Cuda().deviceCount() < 2) GTEST_SKIP() << "one CUDA device";
  const c10::Device before = Cuda().getDevice();
  const int model = before.index() == 0 ? 1 : 0;
  {
    absl::StatusOr<std::unique_ptr<CudaCall>> call = CudaCall::Enter(model, true);
    ASSERT_TRUE(call.ok()) << call.status();
    EXPECT_EQ(Cuda().getDevice().index(), model);
    // Copies without a device index go to the model's.
    EXPECT_EQ(at::arange(4, at::kFloat).cuda().device().index(), model);
    EXPECT_NE(CurrentStream(model), Cuda().getDefaultStream(c10::Device(c10::DeviceType::CUDA, model)));
  }
  EXPECT_EQ(Cuda().getDevice(), before);
}

TEST(CudaSupport, CpuServingIsUnaffectedByLoadingIt) {
  (void)LoadCudaSupport();
  auto model = LoadedVersion::Load(testing::ExampleArtifact("mlp"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  testing::ReferenceCall ref = testing::Reference("mlp", "batch8");
  auto result = (*model)->Call(ref.args);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(at::allclose(testing::AsTensor(result->outputs[0]), ref.expected[0], 1e-4, 1e-5));
}

}  // namespace
}  // namespace precompile
