// The checks in front of ATen kernels that trust their inputs, called as eager
// programs call them: through the dispatcher, by ATen's public operators.
#include "runtime/kernel_input_checks.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace precompile {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTime = 30;
constexpr int64_t kClasses = 12;

// log_probs of 2 sequences, and 2 padded targets of 4 classes each.
struct CtcCall {
  at::Tensor log_probs = at::randn({kTime, 2, kClasses}, at::kDouble).log_softmax(2);
  at::Tensor targets = at::randint(1, kClasses, {2, 4}, at::kLong);
  std::vector<int64_t> input_lengths = {kTime, kTime - 5};
  std::vector<int64_t> target_lengths = {4, 3};

  at::Tensor Loss() const {
    return at::ctc_loss(log_probs, targets, input_lengths, target_lengths, /*blank=*/0,
                        at::Reduction::None);
  }
  at::Tensor LossOfTensors() const {
    return at::ctc_loss(log_probs, targets, at::tensor(input_lengths), at::tensor(target_lengths),
                        /*blank=*/0, at::Reduction::None);
  }
};

std::string RefusalOf(const CtcCall& call, bool tensors) {
  try {
    static_cast<void>(tensors ? call.LossOfTensors() : call.Loss());
  } catch (const c10::IndexError& e) {
    return e.what_without_backtrace();
  }
  return "not refused";
}

class KernelInputChecksTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::manual_seed(0);
    // What the kernel computes unchecked, for a call the checks let through.
    unchecked_ = new at::Tensor(CtcCall().Loss());
    ASSERT_TRUE(InstallKernelInputChecks().ok());
  }
  static at::Tensor* unchecked_;
};
at::Tensor* KernelInputChecksTest::unchecked_ = nullptr;

TEST_F(KernelInputChecksTest, InstallingTwiceIsHarmless) {
  EXPECT_TRUE(InstallKernelInputChecks().ok());
}

TEST_F(KernelInputChecksTest, ACheckedCallGivesTheKernelsResult) {
  at::manual_seed(0);
  const CtcCall call;
  EXPECT_TRUE(at::equal(call.Loss(), *unchecked_));
  EXPECT_TRUE(at::equal(call.LossOfTensors(), *unchecked_));
}

TEST_F(KernelInputChecksTest, ATargetOutsideTheClassesIsRefusedNamingIt) {
  // 1e8 ends an unchecked process; -1 and kClasses read other memory.
  for (const int64_t target : {int64_t{100'000'000}, int64_t{-1}, kClasses}) {
    for (const bool tensors : {false, true}) {
      CtcCall call;
      call.targets[1][2] = target;
      EXPECT_THAT(RefusalOf(call, tensors),
                  HasSubstr("ctc_loss: targets holds " + std::to_string(target) +
                            ", but a target is a class of log_probs' last dimension, 0 to 11: " +
                            std::string(kKernelInputRefused)));
    }
  }
}

TEST_F(KernelInputChecksTest, PaddingPastATargetsLengthIsNotRead) {
  CtcCall call;
  const at::Tensor expected = call.Loss();
  call.targets[1][3] = -100;  // Past target_lengths[1] = 3: padding.
  EXPECT_TRUE(at::equal(call.Loss(), expected));
  EXPECT_TRUE(at::equal(call.LossOfTensors(), expected));
  call.targets[1][2] = -100;  // Within it.
  EXPECT_THAT(RefusalOf(call, false), HasSubstr("targets holds -100"));
}

TEST_F(KernelInputChecksTest, ConcatenatedTargetsAreChecked) {
  CtcCall call;
  const at::Tensor padded = call.Loss();
  // The two targets end to end.
  call.targets = at::cat({call.targets[0], call.targets[1].slice(0, 0, 3)});
  EXPECT_TRUE(at::equal(call.Loss(), padded));
  call.targets[6] = kClasses;  // The second target's last class.
  EXPECT_THAT(RefusalOf(call, true), HasSubstr("targets holds 12"));
}

TEST_F(KernelInputChecksTest, CallsAreCheckedInInferenceModeAndWithGradients) {
  {
    const c10::InferenceMode inference;
    CtcCall call;
    call.targets[0][0] = -7;
    EXPECT_THAT(RefusalOf(call, false), HasSubstr("targets holds -7"));
  }
  CtcCall call;
  call.log_probs.requires_grad_(true);
  call.targets[0][0] = -7;
  EXPECT_THAT(RefusalOf(call, true), HasSubstr("targets holds -7"));
}

TEST_F(KernelInputChecksTest, TheKernelCalledDirectlyIsCheckedToo) {
  CtcCall call;
  call.targets[0][1] = 100'000'000;
  for (const bool tensors : {false, true}) {
    try {
      static_cast<void>(tensors ? at::_ctc_loss(call.log_probs, call.targets,
                                                at::tensor(call.input_lengths),
                                                at::tensor(call.target_lengths))
                                : at::_ctc_loss(call.log_probs, call.targets, call.input_lengths,
                                                call.target_lengths));
      ADD_FAILURE() << "target 1e8 accepted";
    } catch (const c10::IndexError& e) {
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("targets holds 100000000"));
    }
  }
}

// cuDNN's kernels exist on CUDA only, but the check runs before any device's
// kernel is looked up.
TEST_F(KernelInputChecksTest, CudnnsKernelIsCheckedToo) {
  CtcCall call;
  for (const bool tensors : {false, true}) {
    const auto cudnn_loss = [&] {
      static_cast<void>(
          tensors
              ? at::_cudnn_ctc_loss(call.log_probs, call.targets, at::tensor(call.input_lengths),
                                    at::tensor(call.target_lengths), 0,
                                    /*deterministic=*/true, false)
              : at::_cudnn_ctc_loss(call.log_probs, call.targets, call.input_lengths,
                                    call.target_lengths, 0, /*deterministic=*/true, false));
    };
    EXPECT_THROW(cudnn_loss(), c10::NotImplementedError);  // No CPU kernel.
    call.targets[0][1] = 100'000'000;
    try {
      cudnn_loss();
      ADD_FAILURE() << "target 1e8 accepted";
    } catch (const c10::IndexError& e) {
      EXPECT_THAT(e.what_without_backtrace(), HasSubstr("targets holds 100000000"));
    }
    call.targets[0][1] = 1;
  }
}

TEST_F(KernelInputChecksTest, LengthsTheKernelRefusesAreLeftToIt) {
  CtcCall call;
  call.target_lengths = {9, 3};  // Longer than the padded targets.
  try {
    call.Loss();
    ADD_FAILURE() << "a target length past the targets was accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("targets"));
  }
}

std::string IndexErrorOf(const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::IndexError& e) {
    return e.what_without_backtrace();
  }
  return "not refused";
}

// Six rows of 3, and 4 indices into them in bags that start at `offsets`.
at::Tensor Bags(const std::vector<int64_t>& offsets, int64_t mode, bool with_gradients) {
  const at::Tensor weight = at::arange(18, at::kFloat).view({6, 3}).requires_grad_(with_gradients);
  return std::get<0>(at::embedding_bag(weight, at::tensor({1, 2, 3, 5}, at::kLong),
                                       at::tensor(offsets, at::kLong), false, mode));
}

TEST_F(KernelInputChecksTest, BagOffsetsThatGoBackOrOutsideTheIndicesAreRefused) {
  for (const bool with_gradients : {false, true}) {
    for (const int64_t mode : {0, 1, 2}) {  // sum, mean, max
      // The kernels read bags' indices from offset to offset: -5 read the
      // memory before them (2^40 ended the process); 3 then 1 gave a
      // maximum of the wrong rows.
      EXPECT_THAT(IndexErrorOf([&] {
                    Bags({0, -5}, mode, with_gradients);
                  }),
                  HasSubstr("embedding_bag: offsets holds -5, but an offset is from 0 to 4 "
                            "(the count of indices): " +
                            std::string(kKernelInputRefused)));
      EXPECT_THAT(IndexErrorOf([&] {
                    Bags({0, 3, 1}, mode, with_gradients);
                  }),
                  HasSubstr("embedding_bag: offsets holds 1 after 3, but offsets do not decrease"));
    }
  }
  const c10::InferenceMode inference;
  // Rows 1 and 2, then rows 3 and 5.
  EXPECT_TRUE(at::equal(Bags({0, 2}, 0, false),
                        at::tensor({9., 11., 13., 24., 26., 28.}, at::kFloat).view({2, 3})));
}

// Compiled code calls the bag kernel through AOTInductor's C shim, which the
// checks' library defines in place of libtorch's: `offsets` as a compiled
// call passes them. Fills `sums` where the call succeeds.
AOTITorchError CompiledBags(const std::vector<int64_t>& offsets, at::Tensor* sums) {
  namespace aoti = torch::aot_inductor;
  at::Tensor weight = at::arange(18, at::kFloat).view({6, 3});
  at::Tensor indices = at::tensor({1, 2, 3, 5}, at::kLong);
  at::Tensor bag_offsets = at::tensor(offsets, at::kLong);
  AtenTensorHandle outputs[4] = {};
  const AOTITorchError error = aoti_torch_cpu__embedding_bag(
      aoti::tensor_pointer_to_tensor_handle(&weight),
      aoti::tensor_pointer_to_tensor_handle(&indices),
      aoti::tensor_pointer_to_tensor_handle(&bag_offsets), /*scale_grad_by_freq=*/0, /*mode=*/0,
      /*sparse=*/0, /*per_sample_weights=*/nullptr, /*include_last_offset=*/0, /*padding_idx=*/-1,
      &outputs[0], &outputs[1], &outputs[2], &outputs[3]);
  if (error == AOTI_TORCH_SUCCESS) *sums = *aoti::tensor_handle_to_tensor_pointer(outputs[0]);
  for (AtenTensorHandle output : outputs) delete aoti::tensor_handle_to_tensor_pointer(output);
  return error;
}

TEST_F(KernelInputChecksTest, CompiledCodesCallsOfTheBagKernelAreChecked) {
  const c10::InferenceMode inference;
  at::Tensor sums;
  ASSERT_EQ(CompiledBags({0, 2}, &sums), AOTI_TORCH_SUCCESS);
  EXPECT_TRUE(at::equal(sums, at::tensor({9., 11., 13., 24., 26., 28.}, at::kFloat).view({2, 3})));
  // libtorch's shim calls the kernel, which read before the indices.
  EXPECT_EQ(CompiledBags({0, -5}, &sums), AOTI_TORCH_FAILURE);
  EXPECT_EQ(CompiledBags({0, 3, 1}, &sums), AOTI_TORCH_FAILURE);
}

TEST_F(KernelInputChecksTest, CompiledCodesCallsOfTheSegmentKernelAreChecked) {
  namespace aoti = torch::aot_inductor;
  const c10::InferenceMode inference;
  at::Tensor data = at::ones({4});
  const auto sums = [&](std::vector<int64_t> offsets) -> std::optional<at::Tensor> {
    at::Tensor segment_offsets = at::tensor(offsets, at::kLong);
    AtenTensorHandle offsets_handle = aoti::tensor_pointer_to_tensor_handle(&segment_offsets);
    AtenTensorHandle output = nullptr;
    if (aoti_torch_cpu_segment_reduce(aoti::tensor_pointer_to_tensor_handle(&data), "sum",
                                      /*lengths=*/nullptr, /*indices=*/nullptr, &offsets_handle,
                                      /*axis=*/0, /*unsafe=*/0, /*initial=*/nullptr,
                                      &output) != AOTI_TORCH_SUCCESS) {
      return std::nullopt;
    }
    std::unique_ptr<at::Tensor> owned(aoti::tensor_handle_to_tensor_pointer(output));
    return *owned;
  };
  const std::optional<at::Tensor> within = sums({0, 1, 4});
  ASSERT_TRUE(within.has_value());
  EXPECT_TRUE(at::equal(*within, at::tensor({1.f, 3.f})));
  EXPECT_EQ(sums({0, 100'000'000}), std::nullopt);
}

TEST_F(KernelInputChecksTest, SegmentOffsetsPastTheDataAreRefused) {
  const at::Tensor data = at::ones({4});
  const auto sums = [&](std::vector<int64_t> offsets) {
    return at::segment_reduce(data, "sum", std::nullopt, std::nullopt,
                              at::tensor(offsets, at::kLong));
  };
  EXPECT_TRUE(at::equal(sums({0, 1, 4}), at::tensor({1.f, 3.f})));
  EXPECT_THAT(IndexErrorOf([&] {
                sums({0, 100'000'000});
              }),
              HasSubstr("segment_reduce: offsets holds 100000000, but an offset is from 0 to 4"));
  EXPECT_THAT(IndexErrorOf([&] { sums({-5, 2}); }), HasSubstr("offsets holds -5"));
  // Lengths the caller asked the kernel not to check are checked all the same.
  EXPECT_THROW(at::segment_reduce(data, "sum", at::tensor({1, 100'000'000}, at::kLong),
                                  std::nullopt, std::nullopt, 0, /*unsafe=*/true),
               c10::Error);
}

TEST_F(KernelInputChecksTest, PackedSequencesWithImpossibleSizesAreRefused) {
  // As the runtime calls: _pad_packed_sequence has no autograd kernel of
  // its own, so with autograd on it runs before the check's key.
  const c10::InferenceMode inference;
  const at::Tensor steps = at::randn({3, 2, 2});  // 3 steps of a batch of 2.
  EXPECT_EQ(std::get<1>(at::_pack_padded_sequence(steps, at::tensor({3, 1}, at::kLong), false))
                .sum()
                .item<int64_t>(),
            4);
  EXPECT_THAT(IndexErrorOf([&] {
                at::_pack_padded_sequence(steps, at::tensor({100'000'000, 1}, at::kLong), false);
              }),
              HasSubstr("pack_padded_sequence: lengths holds 100000000, but a sequence is at "
                        "most the input's 3 steps"));
  EXPECT_THAT(
      IndexErrorOf([&] {
        at::_pad_packed_sequence(at::randn({4, 2}), at::tensor({2, -5}, at::kLong), false, 0.0, 2);
      }),
      HasSubstr("pad_packed_sequence: batch_sizes holds -5"));
}

TEST_F(KernelInputChecksTest, SparseIndexConversionsRefuseIndicesOutsideTheirBounds) {
  // Each of these calls ended the process unchecked.
  const at::Tensor cols = at::tensor({0, 1, 3}, at::kLong);
  const auto to_coo = [&](std::vector<int64_t> crow) {
    return at::_convert_indices_from_csr_to_coo(at::tensor(crow, at::kLong), cols);
  };
  EXPECT_TRUE(at::equal(to_coo({0, 2, 3}), at::tensor({0, 0, 1, 0, 1, 3}, at::kLong).view({2, 3})));
  EXPECT_THAT(IndexErrorOf([&] {
                to_coo({0, 100'000'000});
              }),
              HasSubstr("_convert_indices_from_csr_to_coo: offsets holds 100000000, but an "
                        "offset is from 0 to 3 (col_indices' count)"));
  EXPECT_THAT(IndexErrorOf([&] { to_coo({0, -5, 3}); }), HasSubstr("offsets holds -5"));

  const auto to_csr = [](std::vector<int64_t> rows, int64_t size) {
    return at::_convert_indices_from_coo_to_csr(at::tensor(rows, at::kLong), size);
  };
  EXPECT_TRUE(at::equal(to_csr({0, 0, 2}, 3), at::tensor({0, 2, 2, 3}, at::kLong)));
  EXPECT_THAT(IndexErrorOf([&] {
                to_csr({0, 100'000'000}, 3);
              }),
              HasSubstr("_convert_indices_from_coo_to_csr: indices holds 100000000, but a row "
                        "index is from 0 to 2"));
  EXPECT_THAT(IndexErrorOf([&] { to_csr({0, -5}, 3); }), HasSubstr("indices holds -5"));
  EXPECT_THAT(IndexErrorOf([&] { to_csr({3}, 3); }), HasSubstr("indices holds 3"));
}

TEST_F(KernelInputChecksTest, SparseTensorsAreCheckedAsTheyAreMade) {
  // A row pointer past the values: densifying it ended the process.
  EXPECT_THROW(at::sparse_csr_tensor(at::tensor({0, 100'000'000, 2}, at::kLong),
                                     at::tensor({0, 1}, at::kLong), at::ones({2}), {2, 4},
                                     at::TensorOptions().dtype(at::kFloat)),
               c10::Error);
  EXPECT_THROW(
      at::sparse_coo_tensor(at::tensor({0, 4}, at::kLong).view({1, 2}), at::ones({2}), {4}),
      c10::Error);
}

}  // namespace
}  // namespace precompile
