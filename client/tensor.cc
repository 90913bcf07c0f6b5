#include "client/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/half_float.h"

namespace precompile::client {
namespace {

struct DatatypeInfo {
  const char* name;
  int size;
};

constexpr DatatypeInfo kDatatypes[] = {
    {"BOOL", 1}, {"UINT8", 1}, {"UINT16", 2}, {"UINT32", 4}, {"UINT64", 8},
    {"INT8", 1}, {"INT16", 2}, {"INT32", 4},  {"INT64", 8},  {"FP16", 2},
    {"BF16", 2}, {"FP32", 4},  {"FP64", 8},
};

template <typename T>
T Load(const Tensor& tensor, int64_t index) {
  T value;
  std::memcpy(&value, tensor.data.data() + index * sizeof(T), sizeof(T));
  return value;
}

}  // namespace

absl::StatusOr<int> ElementSize(absl::string_view datatype) {
  for (const DatatypeInfo& d : kDatatypes) {
    if (datatype == d.name) return d.size;
  }
  if (datatype == "BYTES") {
    return absl::InvalidArgumentError(
        "BYTES tensors are not supported: models served by precompile-serve take numeric "
        "tensors");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown datatype '", datatype,
      "' (known: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, BF16, "
      "FP32, FP64)"));
}

bool IsFloatingDatatype(absl::string_view datatype) {
  return datatype == "FP16" || datatype == "BF16" || datatype == "FP32" || datatype == "FP64";
}

absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", FormatShape(shape), " has a negative dimension"));
    }
    if (d != 0 && count > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", FormatShape(shape), " has too many elements"));
    }
    count *= d;
  }
  return count;
}

absl::Status ValidateTensor(const Tensor& tensor) {
  absl::StatusOr<int> size = ElementSize(tensor.datatype);
  if (!size.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "': ", size.status().message()));
  }
  absl::StatusOr<int64_t> count = ElementCount(tensor.shape);
  if (!count.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name, "': ", count.status().message()));
  }
  if (*count > std::numeric_limits<int64_t>::max() / *size ||
      static_cast<int64_t>(tensor.data.size()) != *count * *size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor.name, "' has ", tensor.data.size(), " bytes but shape ",
        FormatShape(tensor.shape), " of ", tensor.datatype, " needs ", *count * *size));
  }
  return absl::OkStatus();
}

double ElementAsDouble(const Tensor& tensor, int64_t index) {
  const std::string& t = tensor.datatype;
  if (t == "FP32") return Load<float>(tensor, index);
  if (t == "FP64") return Load<double>(tensor, index);
  if (t == "FP16") return HalfToFloat(Load<uint16_t>(tensor, index));
  if (t == "BF16") return BFloat16ToFloat(Load<uint16_t>(tensor, index));
  if (t == "UINT64") return static_cast<double>(Load<uint64_t>(tensor, index));
  return static_cast<double>(ElementAsInt64(tensor, index));
}

int64_t ElementAsInt64(const Tensor& tensor, int64_t index) {
  const std::string& t = tensor.datatype;
  if (t == "BOOL") return Load<uint8_t>(tensor, index) != 0;
  if (t == "UINT8") return Load<uint8_t>(tensor, index);
  if (t == "UINT16") return Load<uint16_t>(tensor, index);
  if (t == "UINT32") return Load<uint32_t>(tensor, index);
  if (t == "UINT64") return static_cast<int64_t>(Load<uint64_t>(tensor, index));
  if (t == "INT8") return Load<int8_t>(tensor, index);
  if (t == "INT16") return Load<int16_t>(tensor, index);
  if (t == "INT32") return Load<int32_t>(tensor, index);
  if (t == "INT64") return Load<int64_t>(tensor, index);
  return static_cast<int64_t>(ElementAsDouble(tensor, index));
}

uint64_t ElementAsUint64(const Tensor& tensor, int64_t index) {
  if (tensor.datatype == "UINT64") return Load<uint64_t>(tensor, index);
  return static_cast<uint64_t>(ElementAsInt64(tensor, index));
}

std::string FormatElement(const Tensor& tensor, int64_t index, int float_digits) {
  if (tensor.datatype == "BOOL") return ElementAsInt64(tensor, index) ? "true" : "false";
  if (tensor.datatype == "UINT64") return absl::StrCat(ElementAsUint64(tensor, index));
  if (!IsFloatingDatatype(tensor.datatype)) return absl::StrCat(ElementAsInt64(tensor, index));
  const double v = ElementAsDouble(tensor, index);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.*g", float_digits, v);
}

std::string FormatShape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace precompile::client
