#include "runtime/kernel_input_checks.h"

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_convert_indices_from_coo_to_csr_ops.h>
#include <ATen/ops/_convert_indices_from_csr_to_coo_ops.h>
#include <ATen/ops/_ctc_loss_ops.h>
#include <ATen/ops/_cudnn_ctc_loss_ops.h>
#include <ATen/ops/_embedding_bag_forward_only_ops.h>
#include <ATen/ops/_embedding_bag_ops.h>
#include <ATen/ops/_pack_padded_sequence_ops.h>
#include <ATen/ops/_pad_packed_sequence_ops.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/segment_reduce_ops.h>
#include <ATen/ops/tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "runtime/torch_errors.h"

namespace precompile {
namespace {

// The kernels a checked call goes on to: those below the check's key.
c10::DispatchKeySet BelowCheck(c10::DispatchKeySet keys) {
  return keys &
         c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::BackendSelect);
}

// Offsets into a dimension of `size` entries, each row (along the last
// dimension) starting a segment where the one before ends: the kernels read
// from offset to offset without checking either.
void CheckOffsets(const char* op, const at::Tensor& offsets, int64_t size, const char* size_is) {
  if (offsets.numel() == 0 || offsets.dim() == 0 ||
      !at::isIntegralType(offsets.scalar_type(), /*includeBool=*/false)) {
    return;
  }
  const at::Tensor rows = offsets.to(at::kCPU, at::kLong).contiguous().view({-1, offsets.size(-1)});
  const auto values = rows.accessor<int64_t, 2>();
  for (int64_t row = 0; row < values.size(0); ++row) {
    int64_t previous = 0;
    for (int64_t i = 0; i < values.size(1); ++i) {
      const int64_t offset = values[row][i];
      TORCH_CHECK_INDEX(offset >= 0 && offset <= size, op, ": offsets holds ", offset,
                        ", but an offset is from 0 to ", size, " (", size_is,
                        "): ", kKernelInputRefused);
      TORCH_CHECK_INDEX(offset >= previous, op, ": offsets holds ", offset, " after ", previous,
                        ", but offsets do not decrease: ", kKernelInputRefused);
      previous = offset;
    }
  }
}

// The value of `values` (integers) outside [0, end): the lowest where one is
// below 0, else the highest; none where every one is within.
std::optional<int64_t> ValueOutside(const at::Tensor& values, int64_t end) {
  const auto [low, high] = at::aminmax(values.to(at::kLong));
  if (const int64_t lowest = low.item<int64_t>(); lowest < 0) return lowest;
  if (const int64_t highest = high.item<int64_t>(); highest >= end) return highest;
  return std::nullopt;
}

// ctc_loss reads log_probs at every target it uses: row i's first
// target_lengths[i] entries of padded (batch, S) targets, or the first
// sum(target_lengths) of concatenated ones. The kernel checks the lengths and
// the shapes itself, so calls it would refuse for those are left to it.
void CheckCtcTargets(const at::Tensor& log_probs, const at::Tensor& targets,
                     const at::Tensor& target_lengths) {
  if (log_probs.dim() != 3 || target_lengths.dim() != 1 || targets.numel() == 0 ||
      !at::isIntegralType(targets.scalar_type(), /*includeBool=*/false)) {
    return;
  }
  at::Tensor read;
  if (targets.dim() == 2) {
    if (target_lengths.size(0) != targets.size(0)) return;
    const at::Tensor lengths =
        target_lengths.to(targets.device(), at::kLong).clamp(0, targets.size(1));
    const at::Tensor positions = at::arange(targets.size(1), lengths.options());
    read = targets.masked_select(positions.unsqueeze(0).lt(lengths.unsqueeze(1)));
  } else if (targets.dim() == 1) {
    const int64_t used =
        target_lengths.to(at::kLong).clamp(0, targets.size(0)).sum().item<int64_t>();
    read = targets.narrow(0, 0, std::min(used, targets.size(0)));
  } else {
    return;
  }
  if (read.numel() == 0) return;
  const int64_t classes = log_probs.size(2);
  const std::optional<int64_t> outside = ValueOutside(read, classes);
  TORCH_CHECK_INDEX(!outside, "ctc_loss: targets holds ", *outside,
                    ", but a target is a class of log_probs' last dimension, 0 to ", classes - 1,
                    ": ", kKernelInputRefused);
}

at::Tensor LengthsTensor(at::IntArrayRef lengths) { return at::tensor(lengths, at::kLong); }

std::tuple<at::Tensor, at::Tensor> CtcLoss(c10::DispatchKeySet keys, const at::Tensor& log_probs,
                                           const at::Tensor& targets, at::IntArrayRef input_lengths,
                                           at::IntArrayRef target_lengths, int64_t blank,
                                           bool zero_infinity) {
  CheckCtcTargets(log_probs, targets, LengthsTensor(target_lengths));
  return at::_ops::_ctc_loss::redispatch(BelowCheck(keys), log_probs, targets, input_lengths,
                                         target_lengths, blank, zero_infinity);
}

std::tuple<at::Tensor, at::Tensor> CudnnCtcLoss(c10::DispatchKeySet keys,
                                                const at::Tensor& log_probs,
                                                const at::Tensor& targets,
                                                at::IntArrayRef input_lengths,
                                                at::IntArrayRef target_lengths, int64_t blank,
                                                bool deterministic, bool zero_infinity) {
  CheckCtcTargets(log_probs, targets, LengthsTensor(target_lengths));
  return at::_ops::_cudnn_ctc_loss::redispatch(BelowCheck(keys), log_probs, targets, input_lengths,
                                               target_lengths, blank, deterministic, zero_infinity);
}

std::tuple<at::Tensor, at::Tensor> CudnnCtcLossOfTensors(
    c10::DispatchKeySet keys, const at::Tensor& log_probs, const at::Tensor& targets,
    const at::Tensor& input_lengths, const at::Tensor& target_lengths, int64_t blank,
    bool deterministic, bool zero_infinity) {
  CheckCtcTargets(log_probs, targets, target_lengths);
  return at::_ops::_cudnn_ctc_loss_Tensor::redispatch(BelowCheck(keys), log_probs, targets,
                                                      input_lengths, target_lengths, blank,
                                                      deterministic, zero_infinity);
}

// The bags' offsets into the indices, which the kernels that sum or average
// the bags read between. (Called with 2-D indices, embedding_bag makes its
// own offsets before this kernel.) `Op` is _embedding_bag or its
// forward-only twin, which take the same arguments.
template <typename Op>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> EmbeddingBag(
    c10::DispatchKeySet keys, const at::Tensor& weight, const at::Tensor& indices,
    const at::Tensor& offsets, bool scale_grad_by_freq, int64_t mode, bool sparse,
    const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  if (indices.dim() == 1 && offsets.dim() == 1) {
    CheckOffsets("embedding_bag", offsets, indices.numel(), "the count of indices");
  }
  return Op::redispatch(BelowCheck(keys), weight, indices, offsets, scale_grad_by_freq, mode,
                        sparse, per_sample_weights, include_last_offset, padding_idx);
}

// Offsets into data along `axis`, which the kernel reads between unchecked.
// Lengths are checked by the kernel unless the caller asked it not to
// (unsafe=True): their check is kept.
at::Tensor SegmentReduce(c10::DispatchKeySet keys, const at::Tensor& data, c10::string_view reduce,
                         const std::optional<at::Tensor>& lengths,
                         const std::optional<at::Tensor>& indices,
                         const std::optional<at::Tensor>& offsets, int64_t axis, bool unsafe,
                         const std::optional<at::Scalar>& initial) {
  if (offsets.has_value() && offsets->defined() && data.dim() > 0 && axis >= -data.dim() &&
      axis < data.dim()) {
    CheckOffsets("segment_reduce", *offsets, data.size(c10::maybe_wrap_dim(axis, data.dim())),
                 "data's size along axis");
  }
  return at::_ops::segment_reduce::redispatch(BelowCheck(keys), data, reduce, lengths, indices,
                                              offsets, axis, /*unsafe=*/false, initial);
}

// pack_padded_sequence makes a batch size for every step up to the longest
// length, so a length past the input's steps costs memory in proportion.
std::tuple<at::Tensor, at::Tensor> PackPaddedSequence(c10::DispatchKeySet keys,
                                                      const at::Tensor& input,
                                                      const at::Tensor& lengths, bool batch_first) {
  const int64_t step_dim = batch_first ? 1 : 0;
  if (input.dim() > step_dim && lengths.numel() > 0 &&
      at::isIntegralType(lengths.scalar_type(), /*includeBool=*/false)) {
    const int64_t longest = lengths.max().item<int64_t>();
    TORCH_CHECK_INDEX(longest <= input.size(step_dim), "pack_padded_sequence: lengths holds ",
                      longest, ", but a sequence is at most the input's ", input.size(step_dim),
                      " steps: ", kKernelInputRefused);
  }
  return at::_ops::_pack_padded_sequence::redispatch(BelowCheck(keys), input, lengths, batch_first);
}

// A batch size below 1 makes pad_packed_sequence corrupt the heap.
std::tuple<at::Tensor, at::Tensor> PadPackedSequence(
    c10::DispatchKeySet keys, const at::Tensor& data, const at::Tensor& batch_sizes,
    bool batch_first, const at::Scalar& padding_value, int64_t total_length) {
  if (batch_sizes.numel() > 0 &&
      at::isIntegralType(batch_sizes.scalar_type(), /*includeBool=*/false)) {
    const int64_t smallest = batch_sizes.min().item<int64_t>();
    TORCH_CHECK_INDEX(smallest >= 1, "pad_packed_sequence: batch_sizes holds ", smallest,
                      ", but every step has a batch of at least 1: ", kKernelInputRefused);
  }
  return at::_ops::_pad_packed_sequence::redispatch(BelowCheck(keys), data, batch_sizes,
                                                    batch_first, padding_value, total_length);
}

// A CSR row pointer into `col_indices`: the kernel writes each row's number
// to the entries from one row's offset to the next's, unchecked.
at::Tensor CsrIndicesToCoo(c10::DispatchKeySet keys, const at::Tensor& crow_indices,
                           const at::Tensor& col_indices, bool out_int32, bool transpose) {
  if (col_indices.dim() > 0) {
    CheckOffsets("_convert_indices_from_csr_to_coo", crow_indices, col_indices.size(-1),
                 "col_indices' count");
  }
  return at::_ops::_convert_indices_from_csr_to_coo::redispatch(BelowCheck(keys), crow_indices,
                                                                col_indices, out_int32, transpose);
}

// COO row indices of a matrix of `size` rows: the kernel writes the row
// pointer at each index without checking it.
at::Tensor CooIndicesToCsr(c10::DispatchKeySet keys, const at::Tensor& rows, int64_t size,
                           bool out_int32) {
  if (rows.numel() > 0 && at::isIntegralType(rows.scalar_type(), /*includeBool=*/false)) {
    const std::optional<int64_t> outside = ValueOutside(rows, size);
    TORCH_CHECK_INDEX(!outside, "_convert_indices_from_coo_to_csr: indices holds ", *outside,
                      ", but a row index is from 0 to ", size - 1, ": ", kKernelInputRefused);
  }
  return at::_ops::_convert_indices_from_coo_to_csr::redispatch(BelowCheck(keys), rows, size,
                                                                out_int32);
}

// What compiled code's call of a bag kernel runs instead (the shims at the
// end of this file): its operator, through the dispatcher and so through the
// check. The dispatcher also applies a conjugate or negative view's flag,
// which the shims that call a kernel directly resolve themselves.
template <typename Op>
AOTITorchError EmbeddingBagThroughDispatcher(AtenTensorHandle weight, AtenTensorHandle indices,
                                             AtenTensorHandle offsets, int32_t scale_grad_by_freq,
                                             int64_t mode, int32_t sparse,
                                             AtenTensorHandle* per_sample_weights,
                                             int32_t include_last_offset, int64_t padding_idx,
                                             AtenTensorHandle* ret0, AtenTensorHandle* ret1,
                                             AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  namespace aoti = torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    auto [output, offset2bag, bag_size, max_indices] =
        Op::call(*aoti::tensor_handle_to_tensor_pointer(weight),
                 *aoti::tensor_handle_to_tensor_pointer(indices),
                 *aoti::tensor_handle_to_tensor_pointer(offsets), scale_grad_by_freq != 0, mode,
                 sparse != 0, aoti::pointer_to_optional<at::Tensor>(per_sample_weights),
                 include_last_offset != 0, padding_idx);
    *ret0 = aoti::new_tensor_handle(std::move(output));
    *ret1 = aoti::new_tensor_handle(std::move(offset2bag));
    *ret2 = aoti::new_tensor_handle(std::move(bag_size));
    *ret3 = aoti::new_tensor_handle(std::move(max_indices));
  });
}

}  // namespace

absl::Status InstallKernelInputChecks() {
  static const absl::Status* const installed =
      new absl::Status(CallTorch("registering the kernels' input checks", [] {
        // Kept for the process: dropping a Library unregisters its kernels.
        // _ctc_loss.Tensor is not among them: it calls _ctc_loss on every
        // device. cuDNN's kernels are reached from ctc_loss directly.
        static auto* const library = new torch::Library(
            torch::Library::IMPL, "aten", c10::DispatchKey::BackendSelect, __FILE__, __LINE__);
        library->impl("_ctc_loss", TORCH_FN(CtcLoss));
        library->impl("_cudnn_ctc_loss", TORCH_FN(CudnnCtcLoss));
        library->impl("_cudnn_ctc_loss.Tensor", TORCH_FN(CudnnCtcLossOfTensors));
        library->impl("_embedding_bag", TORCH_FN(EmbeddingBag<at::_ops::_embedding_bag>));
        library->impl("_embedding_bag_forward_only",
                      TORCH_FN(EmbeddingBag<at::_ops::_embedding_bag_forward_only>));
        library->impl("segment_reduce", TORCH_FN(SegmentReduce));
        library->impl("_pack_padded_sequence", TORCH_FN(PackPaddedSequence));
        library->impl("_pad_packed_sequence", TORCH_FN(PadPackedSequence));
        library->impl("_convert_indices_from_csr_to_coo", TORCH_FN(CsrIndicesToCoo));
        library->impl("_convert_indices_from_coo_to_csr", TORCH_FN(CooIndicesToCsr));
        // Sparse tensors' indices are checked as they are made (torch's
        // check_sparse_tensor_invariants): unchecked, converting or
        // multiplying a CSR tensor with a row pointer past its values, or
        // densifying a COO tensor with an index past its size, reads or
        // writes out of bounds.
        at::globalContext().setCheckSparseTensorInvariants(true);
      }));
  return *installed;
}

}  // namespace precompile

// Compiled code calls the checked kernels through AOTInductor's C shims,
// which libtorch exports and which call each kernel directly, past the
// dispatcher and the checks: a compiled EmbeddingBag given offsets that go
// back by 1e8 ended the process. A binary that links this file defines the
// shims of the checked operators itself and exports them (BUILD.bazel); the
// dynamic linker binds a loaded model's calls to the executable's definition
// before libtorch's, and each calls its operator through the dispatcher, as
// an eager program does. The kernel it reaches is the one libtorch's shim
// calls.
extern "C" {

AOTITorchError aoti_torch_cpu__embedding_bag(AtenTensorHandle weight, AtenTensorHandle indices,
                                             AtenTensorHandle offsets, int32_t scale_grad_by_freq,
                                             int64_t mode, int32_t sparse,
                                             AtenTensorHandle* per_sample_weights,
                                             int32_t include_last_offset, int64_t padding_idx,
                                             AtenTensorHandle* ret0, AtenTensorHandle* ret1,
                                             AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  return precompile::EmbeddingBagThroughDispatcher<at::_ops::_embedding_bag>(
      weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
      include_last_offset, padding_idx, ret0, ret1, ret2, ret3);
}

AOTITorchError aoti_torch_cpu__embedding_bag_forward_only(
    AtenTensorHandle weight, AtenTensorHandle indices, AtenTensorHandle offsets,
    int32_t scale_grad_by_freq, int64_t mode, int32_t sparse, AtenTensorHandle* per_sample_weights,
    int32_t include_last_offset, int64_t padding_idx, AtenTensorHandle* ret0,
    AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  return precompile::EmbeddingBagThroughDispatcher<at::_ops::_embedding_bag_forward_only>(
      weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
      include_last_offset, padding_idx, ret0, ret1, ret2, ret3);
}

AOTITorchError aoti_torch_cpu_segment_reduce(AtenTensorHandle data, const char* reduce,
                                             AtenTensorHandle* lengths, AtenTensorHandle* indices,
                                             AtenTensorHandle* offsets, int64_t axis,
                                             int32_t unsafe, double* initial,
                                             AtenTensorHandle* ret0) {
  namespace aoti = torch::aot_inductor;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *ret0 = aoti::new_tensor_handle(at::_ops::segment_reduce::call(
        *aoti::tensor_handle_to_tensor_pointer(data), reduce,
        aoti::pointer_to_optional<at::Tensor>(lengths),
        aoti::pointer_to_optional<at::Tensor>(indices),
        aoti::pointer_to_optional<at::Tensor>(offsets), axis, unsafe != 0,
        aoti::pointer_to_optional<c10::Scalar>(initial)));
  });
}

// CUDA's shims are the same functions: the dispatcher picks each kernel by
// its tensors' device.
decltype(aoti_torch_cpu__embedding_bag) aoti_torch_cuda__embedding_bag
    __attribute__((alias("aoti_torch_cpu__embedding_bag")));
decltype(aoti_torch_cpu__embedding_bag_forward_only) aoti_torch_cuda__embedding_bag_forward_only
    __attribute__((alias("aoti_torch_cpu__embedding_bag_forward_only")));
decltype(aoti_torch_cpu_segment_reduce) aoti_torch_cuda_segment_reduce
    __attribute__((alias("aoti_torch_cpu_segment_reduce")));

}  // extern "C"
