// The bound on what model calls hold, through libtorch's own CPU allocator.
#include "runtime/inference_memory.h"

#include <ATen/ops/empty.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

namespace precompile {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kLimit = 1 << 20;

at::Tensor Bytes(int64_t n) { return at::empty({n}, at::kByte); }

class InferenceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetInferenceMemoryLimit(kLimit);
    ASSERT_EQ(InferenceMemoryHeld(), 0u);
  }
  void TearDown() override { EXPECT_EQ(InferenceMemoryHeld(), 0u); }
};

TEST_F(InferenceMemoryTest, TensorsOutsideACallAreNotCharged) {
  const at::Tensor weights = Bytes(4 * kLimit);
  EXPECT_EQ(InferenceMemoryHeld(), 0u);
}

TEST_F(InferenceMemoryTest, ACallsTensorsAreChargedUntilFreedOnAnyThread) {
  at::Tensor kept;
  {
    const ChargedCall call;
    kept = Bytes(1000);
    { const at::Tensor scratch = Bytes(3000); EXPECT_EQ(InferenceMemoryHeld(), 4000u); }
    EXPECT_EQ(InferenceMemoryHeld(), 1000u);
  }
  // An output outlives its call, and is freed where its response was sent.
  EXPECT_EQ(InferenceMemoryHeld(), 1000u);
  std::thread([t = std::move(kept)]() mutable { t.reset(); }).join();
  EXPECT_EQ(InferenceMemoryHeld(), 0u);
}

TEST_F(InferenceMemoryTest, AnAllocationPastTheLimitIsRefusedAndTheCallSaysWhy) {
  const uint64_t refusals = InferenceMemoryRefusals();
  at::Tensor first;
  {
    const ChargedCall earlier;  // Its output, held while its response is sent.
    first = Bytes(kLimit / 2);
  }
  const ChargedCall call;
  EXPECT_THROW(Bytes(kLimit / 2 + 1), c10::OutOfMemoryError);
  EXPECT_EQ(InferenceMemoryHeld(), kLimit / 2) << "the refused tensor stays uncharged";
  EXPECT_EQ(InferenceMemoryRefusals(), refusals + 1);
  const absl::Status explained =
      call.Explain(absl::InternalError("running variant forward#0: run_impl failed"), "model 'm'");
  EXPECT_EQ(explained.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(explained.message(),
              AllOf(HasSubstr("model 'm': this call asked for a tensor of 524289 bytes"),
                    HasSubstr("held 524288, past the 1048576 bytes"),
                    HasSubstr("--max_inference_memory_bytes")));
  // What fits still fits.
  EXPECT_EQ(Bytes(kLimit / 2).numel(), static_cast<int64_t>(kLimit / 2));
  EXPECT_TRUE(call.Explain(absl::OkStatus(), "model 'm'").ok());
}

// A call that holds, of its own, what leaves too little for its next tensor
// fails the same way on an idle server: "retry later" would never succeed
// (BEiT at 512x512 under a 256 MiB limit was told to, on every request
// after the first).
TEST_F(InferenceMemoryTest, WhatACallHoldsItselfWithItsNextTensorPastTheLimitIsNotWorthARetry) {
  const ChargedCall call;
  {
    const at::Tensor own = Bytes(kLimit / 2);
    { const at::Tensor freed = Bytes(kLimit / 4); }  // Given back: not its to count.
    EXPECT_THROW(Bytes(kLimit / 2 + 1), c10::OutOfMemoryError);
  }  // A failed call's tensors are freed before it is explained.
  const absl::Status explained =
      call.Explain(absl::InternalError("running variant forward#0: run_impl failed"), "model 'm'");
  EXPECT_EQ(explained.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(explained.message(),
              AllOf(HasSubstr("model 'm': this call asked for a tensor of 524289 bytes while it "
                              "held 524288 of its own, more than the 1048576 bytes"),
                    HasSubstr("send smaller inputs"), Not(HasSubstr("retry"))));
}

// A tensor larger than the whole limit fits at no time: the client is told
// to send smaller inputs, not to retry (GPT-NeoX asked 1x40000 tokens for
// one 6.4 GB tensor past a 4 GiB limit, and was answered 429).
TEST_F(InferenceMemoryTest, ATensorLargerThanTheWholeLimitIsNotWorthARetry) {
  const ChargedCall call;
  EXPECT_THROW(Bytes(kLimit + 1), c10::OutOfMemoryError);
  const absl::Status explained =
      call.Explain(absl::InternalError("running variant forward#0: run_impl failed"), "model 'm'");
  EXPECT_EQ(explained.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(explained.message(),
              AllOf(HasSubstr("model 'm': this call asked for a tensor of 1048577 bytes, more "
                              "than the 1048576 bytes"),
                    HasSubstr("send smaller inputs"), Not(HasSubstr("retry"))));
}

TEST_F(InferenceMemoryTest, AFailureWithoutARefusalIsLeftAsItIs) {
  const ChargedCall call;
  const at::Tensor fits = Bytes(kLimit);
  const absl::Status failure = absl::InternalError("the eager program failed");
  EXPECT_EQ(call.Explain(failure, "model 'm'"), failure);
}

TEST_F(InferenceMemoryTest, SizesNearTwoToTheSixtyFourAreRefusedUncharged) {
  const ChargedCall call;
  c10::Allocator* allocator = c10::GetCPUAllocator();
  EXPECT_THROW(allocator->allocate(std::numeric_limits<size_t>::max() - 8), c10::OutOfMemoryError);
  EXPECT_THROW(allocator->allocate(size_t{1} << 63), c10::OutOfMemoryError);
  EXPECT_EQ(InferenceMemoryHeld(), 0u);
  EXPECT_EQ(call.Explain(absl::InternalError("x"), "m").code(),
            absl::StatusCode::kInvalidArgument);  // It never fits.
}

TEST_F(InferenceMemoryTest, ANestedCallReportsToTheOutermost) {
  const ChargedCall outer;
  {
    const ChargedCall inner;
    EXPECT_THROW(Bytes(2 * kLimit), c10::OutOfMemoryError);
  }
  EXPECT_EQ(outer.Explain(absl::InternalError("x"), "m").code(),
            absl::StatusCode::kInvalidArgument);
  // The outermost call still charges after the nested one ended.
  const at::Tensor after = Bytes(10);
  EXPECT_EQ(InferenceMemoryHeld(), 10u);
}

TEST_F(InferenceMemoryTest, AnUnchargedSectionBelongsToTheModel) {
  const ChargedCall call;
  at::Tensor constants;
  {
    const UnchargedSection model_memory;
    constants = Bytes(2 * kLimit);
  }
  EXPECT_EQ(InferenceMemoryHeld(), 0u);
  const at::Tensor charged_again = Bytes(10);
  EXPECT_EQ(InferenceMemoryHeld(), 10u);
}

TEST_F(InferenceMemoryTest, RawAllocationsAreChargedAndGivenBack) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* raw = nullptr;
  {
    const ChargedCall call;
    raw = allocator->raw_allocate(100);
  }
  EXPECT_EQ(InferenceMemoryHeld(), 100u);
  allocator->raw_deallocate(raw);
}

// A merged batch's stacked inputs are the server's own bytes, not
// libtorch's: they count beside the calls' tensors, on any thread.
TEST_F(InferenceMemoryTest, ChargedBytesAreHeldUntilTheirOwnerEnds) {
  std::optional<ChargedBytes> stacked;
  {
    absl::StatusOr<ChargedBytes> charged = ChargedBytes::Charge(3000, "model 'm'");
    ASSERT_TRUE(charged.ok()) << charged.status();
    stacked.emplace(*std::move(charged));
  }
  EXPECT_EQ(InferenceMemoryHeld(), 3000u) << "moved, still held once";
  {
    const ChargedCall call;
    const at::Tensor beside = Bytes(1000);
    EXPECT_EQ(InferenceMemoryHeld(), 4000u);
  }
  std::thread([owned = std::move(stacked)]() mutable { owned.reset(); }).join();
  EXPECT_EQ(InferenceMemoryHeld(), 0u);
}

TEST_F(InferenceMemoryTest, ChargedBytesPastTheLimitAreRefusedUncharged) {
  const uint64_t refusals = InferenceMemoryRefusals();
  absl::StatusOr<ChargedBytes> half = ChargedBytes::Charge(kLimit / 2, "m");
  ASSERT_TRUE(half.ok());
  const absl::StatusOr<ChargedBytes> more =
      ChargedBytes::Charge(kLimit / 2 + 1, "model 'm': merging 3 requests");
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(),
              AllOf(HasSubstr("model 'm': merging 3 requests: this call asked for stacked "
                              "inputs of 524289 bytes"),
                    HasSubstr("held 524288, past the 1048576 bytes"), HasSubstr("retry later")));
  EXPECT_EQ(InferenceMemoryHeld(), kLimit / 2) << "the refused bytes stay uncharged";
  EXPECT_EQ(InferenceMemoryRefusals(), refusals + 1);
  // Past the whole limit: never worth a retry.
  EXPECT_EQ(ChargedBytes::Charge(kLimit + 1, "m").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChargedBytes::Charge(std::numeric_limits<uint64_t>::max(), "m").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ChargedBytes::Charge(kLimit / 2, "m").ok()) << "what fits still fits";
  EXPECT_EQ(InferenceMemoryHeld(), kLimit / 2);
}

TEST_F(InferenceMemoryTest, LimitZeroCountsWithoutRefusing) {
  SetInferenceMemoryLimit(0);
  {
    const ChargedCall call;
    const at::Tensor large = Bytes(4 * kLimit);
    EXPECT_EQ(InferenceMemoryHeld(), 4 * kLimit);
  }
  SetInferenceMemoryLimit(kLimit);
}

}  // namespace
}  // namespace precompile
