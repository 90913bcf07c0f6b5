#include "client/infer_request.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace precompile::client {
namespace {

template <typename Target, typename Values>
std::string PackTyped(const Values& values) {
  std::string bytes(values.size() * sizeof(Target), '\0');
  for (int i = 0; i < values.size(); ++i) {
    const Target v = static_cast<Target>(values.Get(i));
    std::memcpy(bytes.data() + i * sizeof(Target), &v, sizeof(Target));
  }
  return bytes;
}

// The bytes of typed contents in the raw layout of `datatype`.
absl::StatusOr<std::string> RawFromContents(const std::string& name, const std::string& datatype,
                                            const inference::InferTensorContents& c) {
  if (datatype == "BOOL") return PackTyped<uint8_t>(c.bool_contents());
  if (datatype == "INT8") return PackTyped<int8_t>(c.int_contents());
  if (datatype == "INT16") return PackTyped<int16_t>(c.int_contents());
  if (datatype == "INT32") return PackTyped<int32_t>(c.int_contents());
  if (datatype == "INT64") return PackTyped<int64_t>(c.int64_contents());
  if (datatype == "UINT8") return PackTyped<uint8_t>(c.uint_contents());
  if (datatype == "UINT16") return PackTyped<uint16_t>(c.uint_contents());
  if (datatype == "UINT32") return PackTyped<uint32_t>(c.uint_contents());
  if (datatype == "UINT64") return PackTyped<uint64_t>(c.uint64_contents());
  if (datatype == "FP32") return PackTyped<float>(c.fp32_contents());
  if (datatype == "FP64") return PackTyped<double>(c.fp64_contents());
  return absl::InvalidArgumentError(absl::StrCat("output '", name, "' is ", datatype,
                                                 " in typed contents, which cannot carry it"));
}

}  // namespace

inference::InferParameter ToInferParameter(const ScalarValue& value) {
  inference::InferParameter p;
  if (const auto* b = std::get_if<bool>(&value)) {
    p.set_bool_param(*b);
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    p.set_int64_param(*i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    p.set_double_param(*d);
  } else {
    p.set_string_param(std::get<std::string>(value));
  }
  return p;
}

absl::StatusOr<inference::ModelInferRequest> MakeInferRequest(
    absl::string_view model, const std::vector<Tensor>& inputs,
    const std::map<std::string, ScalarValue>& scalars, const InferRequestOptions& options) {
  inference::ModelInferRequest request;
  request.set_model_name(std::string(model));
  request.set_model_version(options.model_version);
  request.set_id(options.id);
  std::set<std::string> names;
  for (const Tensor& tensor : inputs) {
    if (tensor.name.empty()) return absl::InvalidArgumentError("an input has no name");
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("input '", tensor.name, "' is given more than once"));
    }
    RETURN_IF_ERROR(ValidateTensor(tensor));
    auto* input = request.add_inputs();
    input->set_name(tensor.name);
    input->set_datatype(tensor.datatype);
    for (int64_t d : tensor.shape) input->add_shape(d);
    request.add_raw_input_contents(tensor.data);
  }
  for (const auto& [name, value] : scalars) {
    if (names.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", name, "' is given both as an input and as a parameter"));
    }
    (*request.mutable_parameters())[name] = ToInferParameter(value);
  }
  for (const std::string& output : options.outputs) request.add_outputs()->set_name(output);
  return request;
}

std::string PrecompileParameter(const inference::ModelInferResponse& response,
                                absl::string_view name) {
  auto it = response.parameters().find(std::string(name));
  if (it == response.parameters().end() ||
      it->second.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return "";
  }
  return it->second.string_param();
}

absl::StatusOr<InferResult> ReadInferResponse(const inference::ModelInferResponse& response) {
  InferResult result;
  result.model_name = response.model_name();
  result.model_version = response.model_version();
  result.id = response.id();
  result.outcome = PrecompileParameter(response, "precompile_outcome");
  result.variant = PrecompileParameter(response, "precompile_variant");
  const bool raw = response.raw_output_contents_size() > 0;
  if (raw && response.raw_output_contents_size() != response.outputs_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the response has ", response.outputs_size(), " outputs but ",
                     response.raw_output_contents_size(), " raw_output_contents"));
  }
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    Tensor tensor;
    tensor.name = output.name();
    tensor.datatype = output.datatype();
    tensor.shape.assign(output.shape().begin(), output.shape().end());
    if (raw) {
      tensor.data = response.raw_output_contents(i);
    } else {
      ASSIGN_OR_RETURN(tensor.data,
                       RawFromContents(output.name(), output.datatype(), output.contents()));
    }
    RETURN_IF_ERROR(ValidateTensor(tensor));
    result.outputs.push_back(std::move(tensor));
  }
  return result;
}

}  // namespace precompile::client
