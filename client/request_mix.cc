#include "client/request_mix.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/infer_request.h"
#include "base/json_text.h"
#include "client/tensor_json.h"

namespace precompile::client {
namespace {

absl::Status TemplateError(size_t index, absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "mix template ", index, name.empty() ? "" : absl::StrCat(" (\"", name, "\")"), ": ", what));
}

absl::StatusOr<RequestTemplate> ParseTemplate(size_t index, const Json& spec, std::mt19937_64& rng,
                                              const std::string& base_directory) {
  if (!spec.is_object()) return TemplateError(index, "", "expected an object");
  RequestTemplate t;
  const Json* name = JsonMember(spec, "name");
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return TemplateError(index, "", "\"name\" must be a non-empty string");
  }
  t.name = name->get<std::string>();
  auto error = [&](absl::string_view what) { return TemplateError(index, t.name, what); };
  for (const auto& [key, value] : spec.items()) {
    static const std::set<std::string> kKnown = {"name",   "weight", "model",  "version",
                                                 "inputs", "params", "outputs"};
    if (!kKnown.count(key)) {
      return error(absl::StrCat("unknown field \"", key,
                                "\" (known: name, weight, model, version, inputs, params, "
                                "outputs)"));
    }
  }
  const Json* model = JsonMember(spec, "model");
  if (model == nullptr || !model->is_string() || model->get_ref<const std::string&>().empty()) {
    return error("\"model\" must be a non-empty string");
  }
  t.model = model->get<std::string>();
  if (const Json* weight = JsonMember(spec, "weight")) {
    if (!weight->is_number() || !(weight->get<double>() > 0)) {
      return error("\"weight\" must be a number > 0");
    }
    t.weight = weight->get<double>();
  }
  InferRequestOptions options;
  if (const Json* version = JsonMember(spec, "version")) {
    if (!version->is_string()) return error("\"version\" must be a string");
    options.model_version = version->get<std::string>();
  }
  if (const Json* outputs = JsonMember(spec, "outputs")) {
    if (!outputs->is_array()) return error("\"outputs\" must be an array of names");
    for (const Json& o : *outputs) {
      if (!o.is_string()) return error("\"outputs\" must be an array of names");
      options.outputs.push_back(o.get<std::string>());
    }
  }
  std::vector<Tensor> inputs;
  if (const Json* specs = JsonMember(spec, "inputs")) {
    if (!specs->is_object()) return error("\"inputs\" must map input names to tensor specs");
    for (const auto& [input, tensor_spec] : specs->items()) {
      absl::StatusOr<Tensor> tensor = TensorFromJson(input, tensor_spec, rng, base_directory);
      if (!tensor.ok()) return error(tensor.status().message());
      inputs.push_back(*std::move(tensor));
    }
  }
  std::map<std::string, ScalarValue> scalars;
  if (const Json* params = JsonMember(spec, "params")) {
    if (!params->is_object()) return error("\"params\" must map argument names to values");
    for (const auto& [param, json] : params->items()) {
      absl::StatusOr<ScalarValue> value = ScalarFromJson(json);
      if (!value.ok()) {
        return error(absl::StrCat("parameter '", param, "': ", value.status().message()));
      }
      scalars[param] = *std::move(value);
    }
  }
  absl::StatusOr<inference::ModelInferRequest> request =
      MakeInferRequest(t.model, inputs, scalars, options);
  if (!request.ok()) return error(request.status().message());
  request->set_id(t.name);
  t.request = std::make_shared<const inference::ModelInferRequest>(*std::move(request));
  return t;
}

}  // namespace

absl::StatusOr<std::vector<RequestTemplate>> ParseRequestMix(absl::string_view json, uint64_t seed,
                                                             const std::string& base_directory) {
  absl::StatusOr<Json> parsed = ParseJson(json);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("mix: ", parsed.status().message()));
  }
  if (!parsed->is_array() || parsed->empty()) {
    return absl::InvalidArgumentError("mix: expected a non-empty array of request templates");
  }
  std::mt19937_64 rng(seed);
  std::vector<RequestTemplate> mix;
  std::set<std::string> names;
  for (size_t i = 0; i < parsed->size(); ++i) {
    ASSIGN_OR_RETURN(RequestTemplate t, ParseTemplate(i, (*parsed)[i], rng, base_directory));
    if (!names.insert(t.name).second) {
      return TemplateError(i, t.name, "the name is used twice");
    }
    mix.push_back(std::move(t));
  }
  return mix;
}

absl::StatusOr<std::vector<RequestTemplate>> ReadRequestMix(const std::string& path,
                                                            uint64_t seed) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the mix ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<std::vector<RequestTemplate>> mix =
      ParseRequestMix(contents.str(), seed, std::filesystem::path(path).parent_path().string());
  if (!mix.ok()) {
    return absl::Status(mix.status().code(), absl::StrCat(path, ": ", mix.status().message()));
  }
  return mix;
}

}  // namespace precompile::client
