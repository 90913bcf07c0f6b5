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

// The input specs of each request of a sequence (see request_mix.h).
absl::StatusOr<std::vector<Json>> SequenceSpecs(const Json& inputs, const Json& sequence) {
  if (!sequence.is_object()) return absl::InvalidArgumentError("expected an object");
  for (const auto& [key, value] : sequence.items()) {
    if (key != "requests" && key != "next_inputs" && key != "grow") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown field \"", key, "\" (known: requests, next_inputs, grow)"));
    }
  }
  const Json* requests = JsonMember(sequence, "requests");
  if (requests == nullptr || !requests->is_number_integer() || requests->get<int64_t>() < 2 ||
      requests->get<int64_t>() > kMaxSequenceRequests) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"requests\" must be an integer from 2 to ", kMaxSequenceRequests));
  }
  Json next = inputs;
  if (const Json* replaced = JsonMember(sequence, "next_inputs")) {
    if (!replaced->is_object()) {
      return absl::InvalidArgumentError("\"next_inputs\" must map input names to tensor specs");
    }
    for (const auto& [name, spec] : replaced->items()) next[name] = spec;
  }
  std::vector<std::pair<std::string, int64_t>> grown;
  if (const Json* grow = JsonMember(sequence, "grow")) {
    if (!grow->is_object()) {
      return absl::InvalidArgumentError("\"grow\" must map input names to lengths");
    }
    for (const auto& [name, by] : grow->items()) {
      if (!by.is_number_integer() || by.get<int64_t>() < 1 || by.get<int64_t>() > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"grow\": input '", name, "' must grow by an integer from 1 to 4096"));
      }
      const Json* spec = JsonMember(next, name);
      const Json* shape = spec != nullptr ? JsonMember(*spec, "shape") : nullptr;
      if (shape == nullptr || !shape->is_array() || shape->empty() ||
          !shape->back().is_number_integer() || JsonMember(*spec, "fill") == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "\"grow\": input '", name, "' must be an input with a \"shape\" and a \"fill\""));
      }
      grown.emplace_back(name, by.get<int64_t>());
    }
  }
  std::vector<Json> specs = {inputs};
  for (int64_t k = 1; k < requests->get<int64_t>(); ++k) {
    Json step = next;
    for (const auto& [name, by] : grown) {
      Json& last = step[name]["shape"].back();
      last = last.get<int64_t>() + k * by;
    }
    specs.push_back(std::move(step));
  }
  return specs;
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
    static const std::set<std::string> kKnown = {"name",   "weight", "model",   "version",
                                                 "inputs", "params", "outputs", "sequence"};
    if (!kKnown.count(key)) {
      return error(absl::StrCat("unknown field \"", key,
                                "\" (known: name, weight, model, version, inputs, params, "
                                "outputs, sequence)"));
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
  Json input_specs = Json::object();
  if (const Json* specs = JsonMember(spec, "inputs")) {
    if (!specs->is_object()) return error("\"inputs\" must map input names to tensor specs");
    input_specs = *specs;
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
  auto build = [&](const Json& specs) -> absl::StatusOr<inference::ModelInferRequest> {
    std::vector<Tensor> inputs;
    for (const auto& [input, tensor_spec] : specs.items()) {
      absl::StatusOr<Tensor> tensor = TensorFromJson(input, tensor_spec, rng, base_directory);
      if (!tensor.ok()) return tensor.status();
      inputs.push_back(*std::move(tensor));
    }
    absl::StatusOr<inference::ModelInferRequest> request =
        MakeInferRequest(t.model, inputs, scalars, options);
    if (request.ok()) request->set_id(t.name);
    return request;
  };
  const Json* sequence = JsonMember(spec, "sequence");
  if (sequence == nullptr) {
    absl::StatusOr<inference::ModelInferRequest> request = build(input_specs);
    if (!request.ok()) return error(request.status().message());
    t.request = std::make_shared<const inference::ModelInferRequest>(*std::move(request));
    return t;
  }
  absl::StatusOr<std::vector<Json>> steps = SequenceSpecs(input_specs, *sequence);
  if (!steps.ok()) return error(absl::StrCat("\"sequence\": ", steps.status().message()));
  size_t built_bytes = 0;
  for (size_t k = 0; k < steps->size(); ++k) {
    absl::StatusOr<inference::ModelInferRequest> request = build((*steps)[k]);
    if (!request.ok()) {
      return error(absl::StrCat("request ", k, " of the sequence: ", request.status().message()));
    }
    built_bytes += request->ByteSizeLong();
    if (built_bytes > kMaxSequenceBytes) {
      return error(absl::StrCat("the sequence's first ", k + 1, " requests take ", built_bytes,
                                " bytes, more than the ", kMaxSequenceBytes,
                                " its requests may take built ahead: send fewer or smaller"));
    }
    auto& parameters = *request->mutable_parameters();
    if (k == 0) parameters["sequence_start"].set_bool_param(true);
    if (k + 1 == steps->size()) parameters["sequence_end"].set_bool_param(true);
    t.sequence.push_back(std::make_shared<const inference::ModelInferRequest>(*std::move(request)));
  }
  t.request = t.sequence.front();
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
