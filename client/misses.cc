#include "client/misses.h"

#include <google/protobuf/util/json_util.h>

#include <map>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/json_text.h"
#include "client/infer_request.h"
#include "client/tensor_json.h"

namespace precompile::client {
namespace {

namespace artifact = precompile::artifact::v1;

std::string DTypeText(artifact::DType dtype) {
  return absl::AsciiStrToLower(absl::StripPrefix(artifact::DType_Name(dtype), "DTYPE_"));
}

// The KServe datatype of an artifact dtype; empty when there is none.
std::string KServeDatatype(artifact::DType dtype) {
  switch (dtype) {
    case artifact::DTYPE_BOOL: return "BOOL";
    case artifact::DTYPE_UINT8: return "UINT8";
    case artifact::DTYPE_INT8: return "INT8";
    case artifact::DTYPE_INT16: return "INT16";
    case artifact::DTYPE_INT32: return "INT32";
    case artifact::DTYPE_INT64: return "INT64";
    case artifact::DTYPE_FLOAT16: return "FP16";
    case artifact::DTYPE_BFLOAT16: return "BF16";
    case artifact::DTYPE_FLOAT32: return "FP32";
    case artifact::DTYPE_FLOAT64: return "FP64";
    default: return "";
  }
}

std::string ScalarText(const artifact::Scalar& s) {
  switch (s.value_case()) {
    case artifact::Scalar::kBoolValue: return s.bool_value() ? "True" : "False";
    case artifact::Scalar::kIntValue: return absl::StrCat(s.int_value());
    case artifact::Scalar::kFloatValue: return absl::StrCat(s.float_value());
    case artifact::Scalar::kStringValue:
      return absl::StrCat("'", absl::CEscape(s.string_value()), "'");
    default: return "None";
  }
}

}  // namespace

std::string SignatureText(const artifact::CallSignature& call) {
  std::vector<std::string> args;
  for (const auto& a : call.arguments()) {
    std::string value;
    if (a.has_tensor()) {
      const auto& t = a.tensor();
      value = absl::StrCat(DTypeText(t.dtype()), "[", absl::StrJoin(t.shape(), ", "), "]",
                           t.device() == "cpu" ? "" : absl::StrCat(" on ", t.device()));
    } else {
      value = ScalarText(a.scalar());
    }
    args.push_back(absl::StrCat(a.name(), ": ", value));
  }
  return absl::StrJoin(args, ", ");
}

absl::StatusOr<precompile::v1::MissesResponse> ParseMisses(absl::string_view json) {
  precompile::v1::MissesResponse misses;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), &misses, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a misses file (the JSON of 'precompile_client --json misses MODEL'): ",
        status.message().ToString()));
  }
  if (misses.name().empty()) {
    return absl::InvalidArgumentError("not a misses file: it names no model");
  }
  return misses;
}

absl::StatusOr<std::vector<RequestTemplate>> MissesRequestMix(
    const precompile::v1::MissesResponse& misses, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<RequestTemplate> mix;
  for (const auto& frame : misses.frames()) {
    if (!frame.is_entry()) continue;
    for (const auto& signature : frame.signatures()) {
      const std::string text = SignatureText(signature.call());
      auto error = [&](absl::string_view what) {
        return absl::InvalidArgumentError(
            absl::StrCat("the miss ", frame.frame(), "(", text, ") cannot be sent: ", what));
      };
      std::vector<Tensor> inputs;
      std::map<std::string, ScalarValue> scalars;
      for (const auto& arg : signature.call().arguments()) {
        if (arg.has_tensor()) {
          const std::string datatype = KServeDatatype(arg.tensor().dtype());
          if (datatype.empty()) return error(absl::StrCat("'", arg.name(), "' has no dtype"));
          Json spec = Json::object();
          spec["shape"] = std::vector<int64_t>(arg.tensor().shape().begin(),
                                               arg.tensor().shape().end());
          spec["datatype"] = datatype;
          spec["fill"] = IsFloatingDatatype(datatype) ? "random" : "zeros";
          absl::StatusOr<Tensor> tensor = TensorFromJson(arg.name(), spec, rng);
          if (!tensor.ok()) return error(tensor.status().message());
          inputs.push_back(*std::move(tensor));
          continue;
        }
        const auto& s = arg.scalar();
        switch (s.value_case()) {
          case artifact::Scalar::kBoolValue: scalars[arg.name()] = s.bool_value(); break;
          case artifact::Scalar::kIntValue: scalars[arg.name()] = s.int_value(); break;
          case artifact::Scalar::kFloatValue: scalars[arg.name()] = s.float_value(); break;
          case artifact::Scalar::kStringValue: scalars[arg.name()] = s.string_value(); break;
          default: break;  // None: the protocol has no None; the default applies.
        }
      }
      absl::StatusOr<inference::ModelInferRequest> request =
          MakeInferRequest(misses.name(), inputs, scalars, {});
      if (!request.ok()) return error(request.status().message());
      RequestTemplate t;
      t.name = absl::StrCat(frame.frame(), "(", text, ")");
      t.weight = static_cast<double>(std::max<uint64_t>(signature.count(), 1));
      t.model = misses.name();
      request->set_id(t.name);
      t.request = std::make_shared<const inference::ModelInferRequest>(*std::move(request));
      mix.push_back(std::move(t));
    }
  }
  if (mix.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the misses of model '", misses.name(),
        "' hold no call of its entry frame: nothing a request can send"));
  }
  return mix;
}

}  // namespace precompile::client
