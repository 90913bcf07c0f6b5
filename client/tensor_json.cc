#include "client/tensor_json.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/half_float.h"
#include "base/status_macros.h"
#include "client/npy.h"

namespace precompile::client {
namespace {

absl::Status FieldError(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("input '", name, "': ", what));
}

// What a value is, for a message: a number as written, else its type.
std::string Describe(const Json& value) {
  return value.is_number() ? DumpJson(value, false) : value.type_name();
}

absl::StatusOr<int64_t> ToInt64(const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v > uint64_t{std::numeric_limits<int64_t>::max()}) {
      return absl::InvalidArgumentError(absl::StrCat(v, " does not fit"));
    }
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return absl::InvalidArgumentError(absl::StrCat("expected an integer, got ", Describe(value)));
}

absl::StatusOr<uint64_t> ToUint64(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  return absl::InvalidArgumentError(
      absl::StrCat("expected a non-negative integer, got ", Describe(value)));
}

void Flatten(const Json& value, std::vector<const Json*>& out) {
  if (value.is_array()) {
    for (const Json& e : value) Flatten(e, out);
  } else {
    out.push_back(&value);
  }
}

template <typename T>
void Store(std::string& data, int64_t index, T value) {
  std::memcpy(data.data() + index * sizeof(T), &value, sizeof(T));
}

// Writes `value` (a double) as element `index` of a floating tensor.
void StoreFloating(const std::string& datatype, std::string& data, int64_t index, double value) {
  if (datatype == "FP32") {
    Store(data, index, static_cast<float>(value));
  } else if (datatype == "FP64") {
    Store(data, index, value);
  } else if (datatype == "FP16") {
    Store(data, index, FloatToHalf(static_cast<float>(value)));
  } else {
    Store(data, index, FloatToBFloat16(static_cast<float>(value)));
  }
}

template <typename T>
absl::Status StoreInteger(std::string& data, int64_t index, const Json& value) {
  if constexpr (std::is_unsigned_v<T>) {
    ASSIGN_OR_RETURN(const uint64_t v, ToUint64(value));
    if (v > std::numeric_limits<T>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(v, " does not fit"));
    }
    Store(data, index, static_cast<T>(v));
  } else {
    ASSIGN_OR_RETURN(const int64_t v, ToInt64(value));
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(v, " does not fit"));
    }
    Store(data, index, static_cast<T>(v));
  }
  return absl::OkStatus();
}

absl::Status StoreJsonValue(const std::string& datatype, std::string& data, int64_t index,
                            const Json& value) {
  if (datatype == "BOOL") {
    if (value.is_boolean()) {
      Store<uint8_t>(data, index, value.get<bool>());
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(const int64_t v, ToInt64(value));
    if (v != 0 && v != 1) return absl::InvalidArgumentError("expected true, false, 0 or 1");
    Store<uint8_t>(data, index, static_cast<uint8_t>(v));
    return absl::OkStatus();
  }
  if (IsFloatingDatatype(datatype)) {
    double v;
    if (value.is_number()) {
      v = value.get<double>();
    } else if (value == "NaN") {
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (value == "Infinity") {
      v = HUGE_VAL;
    } else if (value == "-Infinity") {
      v = -HUGE_VAL;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("expected a number, got ", Describe(value)));
    }
    StoreFloating(datatype, data, index, v);
    return absl::OkStatus();
  }
  if (datatype == "UINT8") return StoreInteger<uint8_t>(data, index, value);
  if (datatype == "UINT16") return StoreInteger<uint16_t>(data, index, value);
  if (datatype == "UINT32") return StoreInteger<uint32_t>(data, index, value);
  if (datatype == "UINT64") return StoreInteger<uint64_t>(data, index, value);
  if (datatype == "INT8") return StoreInteger<int8_t>(data, index, value);
  if (datatype == "INT16") return StoreInteger<int16_t>(data, index, value);
  if (datatype == "INT32") return StoreInteger<int32_t>(data, index, value);
  return StoreInteger<int64_t>(data, index, value);
}

// Fills every element with `value` (a number) or a random draw.
void Fill(const std::string& datatype, std::string& data, int64_t count,
          std::optional<double> value, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> real(-1.0, 1.0);
  // As the capture's example calls default to: token ids and class labels
  // start at 0, and a server refuses negative ones.
  std::uniform_int_distribution<int64_t> integer(0, 9);
  std::bernoulli_distribution coin(0.5);
  for (int64_t i = 0; i < count; ++i) {
    if (IsFloatingDatatype(datatype)) {
      StoreFloating(datatype, data, i, value ? *value : real(rng));
      continue;
    }
    const int64_t v =
        value ? static_cast<int64_t>(*value) : (datatype == "BOOL" ? coin(rng) : integer(rng));
    if (datatype == "BOOL") Store<uint8_t>(data, i, v != 0);
    if (datatype == "UINT8") Store(data, i, static_cast<uint8_t>(v));
    if (datatype == "UINT16") Store(data, i, static_cast<uint16_t>(v));
    if (datatype == "UINT32") Store(data, i, static_cast<uint32_t>(v));
    if (datatype == "UINT64") Store(data, i, static_cast<uint64_t>(v));
    if (datatype == "INT8") Store(data, i, static_cast<int8_t>(v));
    if (datatype == "INT16") Store(data, i, static_cast<int16_t>(v));
    if (datatype == "INT32") Store(data, i, static_cast<int32_t>(v));
    if (datatype == "INT64") Store(data, i, v);
  }
}

}  // namespace

absl::StatusOr<Tensor> TensorFromJson(absl::string_view name, const Json& spec,
                                      std::mt19937_64& rng, const std::string& base_directory) {
  if (!spec.is_object()) return FieldError(name, "expected a JSON object");
  for (const auto& [key, value] : spec.items()) {
    if (key != "shape" && key != "datatype" && key != "data" && key != "fill" && key != "npy") {
      return FieldError(name, absl::StrCat("unknown field \"", key,
                                           "\" (known: shape, datatype, data, fill, npy)"));
    }
  }
  const Json* npy = JsonMember(spec, "npy");
  const Json* data = JsonMember(spec, "data");
  const Json* fill = JsonMember(spec, "fill");
  if ((npy != nullptr) + (data != nullptr) + (fill != nullptr) != 1) {
    return FieldError(name, "give exactly one of \"data\", \"fill\" and \"npy\"");
  }
  if (npy != nullptr) {
    if (!npy->is_string()) return FieldError(name, "\"npy\" must be a path");
    std::filesystem::path path(npy->get<std::string>());
    if (path.is_relative() && !base_directory.empty()) path = base_directory / path;
    ASSIGN_OR_RETURN(Tensor tensor, ReadNpy(path.string()));
    tensor.name = std::string(name);
    return tensor;
  }
  Tensor tensor;
  tensor.name = std::string(name);
  tensor.datatype = "FP32";
  if (const Json* datatype = JsonMember(spec, "datatype")) {
    if (!datatype->is_string()) return FieldError(name, "\"datatype\" must be a string");
    tensor.datatype = datatype->get<std::string>();
  }
  absl::StatusOr<int> size = ElementSize(tensor.datatype);
  if (!size.ok()) return FieldError(name, size.status().message());
  const Json* shape = JsonMember(spec, "shape");
  if (shape == nullptr || !shape->is_array()) {
    return FieldError(name, "\"shape\" must be an array of dimensions");
  }
  for (const Json& d : *shape) {
    absl::StatusOr<int64_t> dim = ToInt64(d);
    if (!dim.ok() || *dim < 0) return FieldError(name, "dimensions must be integers >= 0");
    tensor.shape.push_back(*dim);
  }
  absl::StatusOr<int64_t> count = ElementCount(tensor.shape);
  if (!count.ok()) return FieldError(name, count.status().message());
  if (*count > (int64_t{1} << 32) / *size) return FieldError(name, "larger than 4 GiB");
  tensor.data.assign(*count * *size, '\0');
  if (fill != nullptr) {
    std::optional<double> value;
    if (fill->is_number()) {
      value = fill->get<double>();
    } else if (*fill == "zeros") {
      value = 0;
    } else if (*fill == "ones") {
      value = 1;
    } else if (*fill != "random") {
      return FieldError(name, "\"fill\" is \"zeros\", \"ones\", \"random\" or a number");
    }
    Fill(tensor.datatype, tensor.data, *count, value, rng);
    return tensor;
  }
  std::vector<const Json*> values;
  Flatten(*data, values);
  if (static_cast<int64_t>(values.size()) != *count) {
    return FieldError(name, absl::StrCat("shape ", FormatShape(tensor.shape), " needs ", *count,
                                         " values, \"data\" has ", values.size()));
  }
  for (int64_t i = 0; i < *count; ++i) {
    absl::Status stored = StoreJsonValue(tensor.datatype, tensor.data, i, *values[i]);
    if (!stored.ok()) {
      return FieldError(name,
                        absl::StrCat("value ", i, " as ", tensor.datatype, ": ", stored.message()));
    }
  }
  return tensor;
}

absl::StatusOr<ScalarValue> ScalarFromJson(const Json& value) {
  if (value.is_boolean()) return ScalarValue(value.get<bool>());
  if (value.is_string()) return ScalarValue(value.get<std::string>());
  if (value.is_number_integer()) {
    ASSIGN_OR_RETURN(const int64_t v, ToInt64(value));
    return ScalarValue(v);
  }
  if (value.is_number()) return ScalarValue(value.get<double>());
  return absl::InvalidArgumentError(
      absl::StrCat("a parameter is a bool, a number or a string, not ", value.type_name()));
}

ScalarValue ScalarFromText(absl::string_view text) {
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
    return std::string(text.substr(1, text.size() - 2));
  }
  int64_t i;
  if (absl::SimpleAtoi(text, &i)) return i;
  double d;
  // SimpleAtod takes hex and "infinity" too; keep to decimal forms people type.
  if (!text.empty() && text.find_first_not_of("0123456789+-.eE") == absl::string_view::npos &&
      absl::SimpleAtod(text, &d)) {
    return d;
  }
  if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "inf") return HUGE_VAL;
  if (text == "-inf") return -HUGE_VAL;
  return std::string(text);
}

Json TensorValuesJson(const Tensor& tensor) {
  Json values = Json::array();
  absl::StatusOr<int64_t> count = ElementCount(tensor.shape);
  const int digits = tensor.datatype == "FP64" ? 17 : 9;
  for (int64_t i = 0; i < count.value_or(0); ++i) {
    if (tensor.datatype == "BOOL") {
      values.push_back(ElementAsInt64(tensor, i) != 0);
    } else if (tensor.datatype == "UINT64") {
      values.push_back(ElementAsUint64(tensor, i));
    } else if (IsFloatingDatatype(tensor.datatype)) {
      values.push_back(JsonDouble(ElementAsDouble(tensor, i), digits));
    } else {
      values.push_back(ElementAsInt64(tensor, i));
    }
  }
  return values;
}

Json ScalarJson(const ScalarValue& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) return JsonDouble(*d);
  return std::get<std::string>(value);
}

}  // namespace precompile::client
