// CUDA support is loaded on demand. Without a GPU, loading still finds and
// loads libtorch_cuda from the wheel and then says that no device is usable;
// with one, a CUDA tensor round-trips. CPU serving is unaffected either way.
#include "runtime/cuda_support.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
