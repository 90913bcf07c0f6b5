#include "server/api/tensor_codec.h"

#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace precompile::server {
namespace {

struct DatatypeName {
  DType dtype;
  const char* name;
  inference::DataType config;
};

constexpr DatatypeName kDatatypes[] = {
    {DType::kBool, "BOOL", inference::TYPE_BOOL},
    {DType::kUInt8, "UINT8", inference::TYPE_UINT8},
    {DType::kInt8, "INT8", inference::TYPE_INT8},
    {DType::kInt16, "INT16", inference::TYPE_INT16},
    {DType::kInt32, "INT32", inference::TYPE_INT32},
    {DType::kInt64, "INT64", inference::TYPE_INT64},
    {DType::kFloat16, "FP16", inference::TYPE_FP16},
    {DType::kBFloat16, "BF16", inference::TYPE_BF16},
    {DType::kFloat32, "FP32", inference::TYPE_FP32},
    {DType::kFloat64, "FP64", inference::TYPE_FP64},
};

// Copies typed contents into `storage` as `Target` values, checking that
// each value fits.
template <typename Target, typename Source>
absl::Status CopyTyped(const google::protobuf::RepeatedField<Source>& values,
                       const std::string& name, std::string* storage) {
  storage->resize(values.size() * sizeof(Target));
  auto* out = reinterpret_cast<Target*>(storage->data());
  for (int i = 0; i < values.size(); ++i) {
    const Source v = values.Get(i);
    if constexpr (std::is_integral_v<Target> && !std::is_same_v<Target, bool>) {
      if (v < static_cast<Source>(std::numeric_limits<Target>::min()) ||
          v > static_cast<Source>(std::numeric_limits<Target>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input '", name, "': value ", v, " at index ", i,
            " does not fit its datatype"));
      }
    }
    out[i] = static_cast<Target>(v);
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<DType> DTypeFromDatatype(absl::string_view datatype) {
  for (const auto& d : kDatatypes) {
    if (datatype == d.name) return d.dtype;
  }
  return std::nullopt;
}

const char* DatatypeOf(DType dtype) {
  for (const auto& d : kDatatypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "BYTES";
}

inference::DataType ConfigDataTypeOf(DType dtype) {
  for (const auto& d : kDatatypes) {
    if (d.dtype == dtype) return d.config;
  }
  return inference::TYPE_INVALID;
}

absl::StatusOr<TensorArg> DecodeInput(const inference::ModelInferRequest& request,
                                      int index, std::string* storage) {
  const auto& input = request.inputs(index);
  const std::string& name = input.name();
  std::optional<DType> dtype = DTypeFromDatatype(input.datatype());
  if (!dtype) {
    std::vector<const char*> known;
    for (const auto& d : kDatatypes) known.push_back(d.name);
    return absl::InvalidArgumentError(absl::StrCat(
        "input '", name, "' has datatype '", input.datatype(),
        "', which is not one of ", absl::StrJoin(known, ", ")));
  }
  TensorArg tensor;
  tensor.dtype = *dtype;
  tensor.shape.assign(input.shape().begin(), input.shape().end());
  const uint64_t element_size = DTypeSize(*dtype);
  absl::StatusOr<uint64_t> counted =
      ElementCount(tensor.shape, element_size, absl::StrCat("input '", name, "'"));
  if (!counted.ok()) return counted.status();
  const uint64_t numel = *counted;
  const uint64_t expected_bytes = numel * element_size;

  if (request.raw_input_contents_size() > 0) {
    if (request.raw_input_contents_size() != request.inputs_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the request has ", request.inputs_size(), " inputs but ",
          request.raw_input_contents_size(),
          " raw_input_contents: either every input's data is in raw_input_contents, in the "
          "inputs' order, or every input's is in its own contents"));
    }
    if (input.has_contents()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' has both raw and typed contents"));
    }
    const std::string& raw = request.raw_input_contents(index);
    if (raw.size() != expected_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' has ", raw.size(), " bytes but shape [",
          absl::StrJoin(tensor.shape, ", "), "] of ", input.datatype(), " needs ",
          expected_bytes));
    }
    tensor.data = raw.data();
    tensor.nbytes = raw.size();
    return tensor;
  }

  const auto& c = input.contents();
  // Checks the value count against the shape, then copies.
  auto typed = [&](const auto& values, auto target) -> absl::Status {
    using Target = typename decltype(target)::type;
    if (static_cast<uint64_t>(values.size()) != numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' has ", values.size(), " values but shape [",
          absl::StrJoin(tensor.shape, ", "), "] needs ", numel));
    }
    return CopyTyped<Target>(values, name, storage);
  };
  absl::Status copied;
  switch (*dtype) {
    case DType::kBool:
      copied = typed(c.bool_contents(), std::type_identity<bool>{});
      break;
    case DType::kUInt8:
      copied = typed(c.uint_contents(), std::type_identity<uint8_t>{});
      break;
    case DType::kInt8:
      copied = typed(c.int_contents(), std::type_identity<int8_t>{});
      break;
    case DType::kInt16:
      copied = typed(c.int_contents(), std::type_identity<int16_t>{});
      break;
    case DType::kInt32:
      copied = typed(c.int_contents(), std::type_identity<int32_t>{});
      break;
    case DType::kInt64:
      copied = typed(c.int64_contents(), std::type_identity<int64_t>{});
      break;
    case DType::kFloat32:
      copied = typed(c.fp32_contents(), std::type_identity<float>{});
      break;
    case DType::kFloat64:
      copied = typed(c.fp64_contents(), std::type_identity<double>{});
      break;
    case DType::kFloat16:
    case DType::kBFloat16:
      return absl::InvalidArgumentError(absl::StrCat(
          "input '", name, "' is ", input.datatype(),
          ", which travels only in raw_input_contents"));
  }
  if (!copied.ok()) return copied;
  tensor.data = storage->data();
  tensor.nbytes = storage->size();
  return tensor;
}

void DescribeOutput(const OutputTensor& tensor, const std::string& name,
                    inference::ModelInferResponse* response) {
  auto* out = response->add_outputs();
  out->set_name(name);
  out->set_datatype(DatatypeOf(tensor.dtype));
  for (int64_t d : tensor.shape) out->add_shape(d);
}

}  // namespace precompile::server
