#include "runtime/call_binding.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/cuda_support.h"
#include "runtime/torch_dtype.h"
#include "runtime/torch_errors.h"

namespace precompile {
namespace {

using artifact::v1::Parameter;

absl::string_view KindWord(Parameter::Kind kind) {
  switch (kind) {
    case Parameter::TENSOR: return "a tensor";
    case Parameter::OPTIONAL_TENSOR: return "a tensor or None";
    case Parameter::INT: return "an int";
    case Parameter::FLOAT: return "a float";
    case Parameter::BOOL: return "a bool";
    case Parameter::STRING: return "a string";
    default: return "a value";
  }
}

// An uninitialised host tensor of `like`'s sizes and dtype in pinned memory
// (libtorch's caching host allocator), which copies to and from a CUDA
// device can be queued from.
at::Tensor EmptyPinned(const at::Tensor& like) {
  return at::empty(like.sizes(), at::TensorOptions().dtype(like.scalar_type()).pinned_memory(true));
}

// A Value from the caller, as the interpreter and compiled code take it.
absl::StatusOr<c10::IValue> ToIValue(const std::string& name,
                                     Parameter::Kind kind, const Value& value) {
  auto wrong = [&](absl::string_view got) {
    return absl::InvalidArgumentError(absl::StrCat(
        "argument '", name, "' must be ", KindWord(kind), ", got ", got));
  };
  const bool any = kind == Parameter::KIND_UNSPECIFIED;
  if (std::holds_alternative<NoneArg>(value)) {
    if (!any && kind != Parameter::OPTIONAL_TENSOR) return wrong("None");
    return c10::IValue();
  }
  if (const auto* t = std::get_if<TensorArg>(&value)) {
    if (!any && kind != Parameter::TENSOR && kind != Parameter::OPTIONAL_TENSOR) {
      return wrong("a tensor");
    }
    const uint64_t size = DTypeSize(t->dtype);
    ASSIGN_OR_RETURN(const uint64_t numel,
                     ElementCount(t->shape, size, absl::StrCat("argument '", name, "'")));
    if (numel * size != t->nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument '", name, "' has ", t->nbytes, " bytes but its shape [",
          absl::StrJoin(t->shape, ", "), "] of ", DTypeName(t->dtype), " needs ",
          numel * size));
    }
    at::TensorOptions options = at::TensorOptions().dtype(ToScalarType(t->dtype));
    // In device memory: on the model's device, current for the call
    // (CudaCall in runtime/cuda_support.h).
    if (t->device == DeviceType::kCuda) options = options.device(at::kCUDA);
    return CallTorch("wrapping a request tensor", [&] {
      return c10::IValue(at::from_blob(const_cast<void*>(t->data), t->shape, options));
    });
  }
  if (const bool* b = std::get_if<bool>(&value)) {
    if (!any && kind != Parameter::BOOL) return wrong("a bool");
    return c10::IValue(*b);
  }
  if (const int64_t* i = std::get_if<int64_t>(&value)) {
    if (kind == Parameter::FLOAT) return c10::IValue(static_cast<double>(*i));
    if (!any && kind != Parameter::INT) return wrong("an int");
    return c10::IValue(*i);
  }
  if (const double* f = std::get_if<double>(&value)) {
    if (!any && kind != Parameter::FLOAT) return wrong("a float");
    return c10::IValue(*f);
  }
  const auto& s = std::get<std::string>(value);
  if (!any && kind != Parameter::STRING) return wrong("a string");
  return c10::IValue(s);
}

template <typename T>
std::optional<std::pair<size_t, int64_t>> FirstOutside(const void* data, size_t n,
                                                       int64_t min, int64_t max) {
  const T* values = static_cast<const T*>(data);
  for (size_t i = 0; i < n; ++i) {
    const int64_t v = static_cast<int64_t>(values[i]);
    if (v < min || v >= max) return std::make_pair(i, v);
  }
  return std::nullopt;
}

// Compiled code that indexes a table past its end ends the process (the
// bounds check throws inside an OpenMP region), so the values the capture
// found used as indices, or used to compute them (an attention mask whose
// ones count positions), are checked before any code runs.
constexpr absl::string_view kWhyInRange =
    ", the range in which the capture proved the model's table lookups stay in bounds";

absl::Status CheckIndexRange(const std::string& name, const TensorArg& t,
                             const artifact::v1::IndexRange& range) {
  std::optional<std::pair<size_t, int64_t>> outside;
  const size_t n = t.nbytes / DTypeSize(t.dtype);
  switch (t.dtype) {
    case DType::kInt64: outside = FirstOutside<int64_t>(t.data, n, range.min(), range.max()); break;
    case DType::kInt32: outside = FirstOutside<int32_t>(t.data, n, range.min(), range.max()); break;
    case DType::kInt16: outside = FirstOutside<int16_t>(t.data, n, range.min(), range.max()); break;
    case DType::kInt8: outside = FirstOutside<int8_t>(t.data, n, range.min(), range.max()); break;
    case DType::kUInt8: outside = FirstOutside<uint8_t>(t.data, n, range.min(), range.max()); break;
    default: return absl::OkStatus();  // Not indices: the guards refuse its dtype.
  }
  if (!outside) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "argument '", name, "' holds ", outside->second, " at flat index ", outside->first,
      "; each value must be in [", range.min(), ", ", range.max(), ")", kWhyInRange));
}

}  // namespace

c10::IValue ScalarToIValue(const artifact::v1::Scalar& s) {
  switch (s.value_case()) {
    case artifact::v1::Scalar::kBoolValue: return c10::IValue(s.bool_value());
    case artifact::v1::Scalar::kIntValue: return c10::IValue(s.int_value());
    case artifact::v1::Scalar::kFloatValue: return c10::IValue(s.float_value());
    case artifact::v1::Scalar::kStringValue: return c10::IValue(s.string_value());
    default: return c10::IValue();
  }
}

// The same check for a frame an eager program calls, whose arguments are
// tensors already (on the model's device): the entry's are checked on the
// request's bytes before they become tensors.
absl::Status CheckIndexRanges(const artifact::v1::Frame& frame,
                              const std::vector<c10::IValue>& args) {
  for (int p = 0; p < frame.parameters_size() && p < static_cast<int>(args.size()); ++p) {
    const artifact::v1::Parameter& param = frame.parameters(p);
    if (!param.has_index_range() || !args[p].isTensor()) continue;
    const at::Tensor& t = args[p].toTensor();
    if (t.numel() == 0 || !at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) continue;
    ASSIGN_OR_RETURN(auto extremes, CallTorch("checking index values", [&] {
                       auto [lo, hi] = at::aminmax(t);
                       return std::make_pair(lo.item<int64_t>(), hi.item<int64_t>());
                     }));
    const auto [lo, hi] = extremes;
    const artifact::v1::IndexRange& range = param.index_range();
    if (lo >= range.min() && hi < range.max()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "frame '", frame.name(), "': argument '", param.name(), "' holds ",
        lo < range.min() ? lo : hi, "; each value must be in [", range.min(), ", ", range.max(), ")",
        kWhyInRange));
  }
  return absl::OkStatus();
}

absl::StatusOr<BoundArguments> BindArguments(const artifact::v1::Frame& frame,
                                             absl::string_view model,
                                             absl::Span<const NamedValue> args, DeviceType device,
                                             CudaCopies copies) {
  const int n = frame.parameters_size();
  std::vector<std::optional<c10::IValue>> bound(n);
  BoundArguments result;
  for (const NamedValue& arg : args) {
    int index = -1;
    for (int i = 0; i < n; ++i) {
      if (frame.parameters(i).name() == arg.name) index = i;
    }
    if (index < 0) {
      std::vector<absl::string_view> names;
      for (const Parameter& p : frame.parameters()) names.push_back(p.name());
      return UnknownArgumentError(model, arg.name, absl::StrJoin(names, ", "));
    }
    if (bound[index]) {
      return absl::InvalidArgumentError(
          absl::StrCat("argument '", arg.name, "' is given more than once"));
    }
    const Parameter& param = frame.parameters(index);
    const TensorArg* tensor = std::get_if<TensorArg>(&arg.value);
    if (tensor != nullptr && tensor->device != DeviceType::kCpu && tensor->device != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument '", arg.name, "' is in ", DeviceTypeName(tensor->device),
          " memory but model '", model, "' runs on ", DeviceTypeName(device)));
    }
    ASSIGN_OR_RETURN(c10::IValue value, ToIValue(arg.name, param.kind(), arg.value));
    if (param.has_index_range() && value.isTensor()) {
      if (tensor->device == DeviceType::kCpu) {
        RETURN_IF_ERROR(CheckIndexRange(arg.name, *tensor, param.index_range()));
      } else {
        ASSIGN_OR_RETURN(at::Tensor host, CallTorch("reading an index argument from the GPU",
                                                    [&] { return value.toTensor().cpu(); }));
        TensorArg on_host = *tensor;
        on_host.device = DeviceType::kCpu;
        on_host.data = host.data_ptr();
        RETURN_IF_ERROR(CheckIndexRange(arg.name, on_host, param.index_range()));
      }
    }
    if (value.isTensor()) {
      result.request_tensors.push_back(value.toTensor());
      // Requests arrive in host memory; the model's guards, variants and
      // eager programs see its arguments on the model's device.
      if (device == DeviceType::kCuda && !value.toTensor().is_cuda()) {
        // Not blocking either way: the model's work waits on the same
        // stream. From pageable memory CUDA returns only once it has staged
        // the bytes itself, in pieces; from pinned memory the copy is queued
        // whole and the thread goes on (libtorch's pinned allocator keeps
        // the buffer until the copy is done).
        absl::Status moved = CallTorch("copying a request tensor to the GPU", [&] {
          at::Tensor host = value.toTensor();
          if (copies == CudaCopies::kPinned) {
            at::Tensor staged = EmptyPinned(host);
            staged.copy_(host);
            host = std::move(staged);
          }
          value = host.to(at::kCUDA, /*non_blocking=*/true);
        });
        if (!moved.ok()) return moved;
      }
    }
    bound[index] = std::move(value);
  }
  result.positional.reserve(n);
  for (int i = 0; i < n; ++i) {
    if (bound[i]) {
      result.positional.push_back(*std::move(bound[i]));
    } else if (frame.parameters(i).has_default_value()) {
      result.positional.push_back(ScalarToIValue(frame.parameters(i).default_value()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing argument '", frame.parameters(i).name(), "' of model '", model, "'"));
    }
  }
  return result;
}

absl::StatusOr<std::vector<OutputTensor>> HostOutputs(std::vector<at::Tensor> outputs,
                                                      absl::Span<const at::Tensor> request_tensors,
                                                      const std::vector<bool>* on_device,
                                                      CudaCopies copies) {
  std::vector<OutputTensor> host_outputs;
  host_outputs.reserve(outputs.size());
  for (const at::Tensor& t : outputs) {
    if (!FromScalarType(t.scalar_type())) {
      return absl::InternalError(absl::StrCat("an output has dtype ",
                                              c10::toString(t.scalar_type()),
                                              ", which cannot be returned"));
    }
  }
  // Outputs are made contiguous, copied where they alias one of the request
  // tensors or are a part of a larger tensor, and brought to the host
  // unless they stay; what is queued on the device's current stream (copies
  // to pinned memory, work on what stays) is then waited for once. A copy to
  // pageable memory has waited for the stream itself.
  int wait_for_device = -1;  // -1: nothing was queued.
  std::vector<at::Tensor> kept(outputs.size());
  std::vector<at::Tensor> pinned(outputs.size());
  absl::Status converted = CallTorch("reading the outputs", [&] {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const at::Tensor& t = outputs[i];
      const bool stays = t.is_cuda() && on_device != nullptr && i < on_device->size() &&
                         (*on_device)[i];
      const bool queued = stays || (t.is_cuda() && copies == CudaCopies::kPinned);
      if (queued) wait_for_device = t.get_device();
      if (queued && !stays) {
        pinned[i] = EmptyPinned(t);
        pinned[i].copy_(t, /*non_blocking=*/true);
        continue;
      }
      at::Tensor host = t.is_cuda() && !stays ? t.cpu() : t;
      host = host.contiguous();
      // An output may alias a request buffer (a frame that returns its
      // input); the caller must be able to keep it after the request is gone.
      bool copy = false;
      for (const at::Tensor& in : request_tensors) {
        if (host.is_alias_of(in)) {
          copy = true;
          break;
        }
      }
      // Nor may an output keep more memory alive than its own bytes (a
      // slice of a larger tensor keeps all of it): what holds outputs (a
      // sequence's state between requests, a response being sent) counts
      // their nbytes.
      if (host.has_storage() && host.storage().nbytes() > host.nbytes()) copy = true;
      kept[i] = copy ? host.clone() : std::move(host);
    }
  });
  if (!converted.ok()) return converted;
  // The copies to pinned memory are only queued so far, and another call,
  // on another stream, may read what stays on the device.
  if (wait_for_device >= 0) RETURN_IF_ERROR(SynchronizeCurrentStream(wait_for_device));
  // Out of the pinned buffers, which go back to libtorch's cache at once,
  // into memory the caller keeps: libtorch's CPU allocator, where the
  // memory that calls hold is counted (runtime/inference_memory.h) and
  // which, unlike pinned memory, the system may page out.
  converted = CallTorch("reading the outputs", [&] {
    for (size_t i = 0; i < pinned.size(); ++i) {
      if (!pinned[i].defined()) continue;
      kept[i] = at::empty(pinned[i].sizes(), at::TensorOptions().dtype(pinned[i].scalar_type()));
      kept[i].copy_(pinned[i]);
      pinned[i].reset();
    }
  });
  if (!converted.ok()) return converted;
  for (at::Tensor& t : kept) {
    auto holder = std::make_shared<at::Tensor>(std::move(t));
    OutputTensor out;
    out.dtype = *FromScalarType(holder->scalar_type());
    out.device = holder->is_cuda() ? DeviceType::kCuda : DeviceType::kCpu;
    out.shape.assign(holder->sizes().begin(), holder->sizes().end());
    out.data = holder->data_ptr();
    out.nbytes = holder->nbytes();
    out.owner = std::shared_ptr<const void>(holder, holder->data_ptr());
    host_outputs.push_back(std::move(out));
  }
  return host_outputs;
}

}  // namespace precompile
