#include "runtime/dtype.h"

namespace precompile {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kUInt8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "unknown";
}

absl::string_view DeviceTypeName(DeviceType device) {
  return device == DeviceType::kCuda ? "cuda" : "cpu";
}

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kUInt8:
    case DType::kInt8: return 1;
    case DType::kInt16:
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    case DType::kInt64:
    case DType::kFloat64: return 8;
  }
  return 0;
}

std::optional<DType> DTypeFromProto(artifact::v1::DType dtype) {
  switch (dtype) {
    case artifact::v1::DTYPE_BOOL: return DType::kBool;
    case artifact::v1::DTYPE_UINT8: return DType::kUInt8;
    case artifact::v1::DTYPE_INT8: return DType::kInt8;
    case artifact::v1::DTYPE_INT16: return DType::kInt16;
    case artifact::v1::DTYPE_INT32: return DType::kInt32;
    case artifact::v1::DTYPE_INT64: return DType::kInt64;
    case artifact::v1::DTYPE_FLOAT16: return DType::kFloat16;
    case artifact::v1::DTYPE_BFLOAT16: return DType::kBFloat16;
    case artifact::v1::DTYPE_FLOAT32: return DType::kFloat32;
    case artifact::v1::DTYPE_FLOAT64: return DType::kFloat64;
    default: return std::nullopt;
  }
}

artifact::v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kBool: return artifact::v1::DTYPE_BOOL;
    case DType::kUInt8: return artifact::v1::DTYPE_UINT8;
    case DType::kInt8: return artifact::v1::DTYPE_INT8;
    case DType::kInt16: return artifact::v1::DTYPE_INT16;
    case DType::kInt32: return artifact::v1::DTYPE_INT32;
    case DType::kInt64: return artifact::v1::DTYPE_INT64;
    case DType::kFloat16: return artifact::v1::DTYPE_FLOAT16;
    case DType::kBFloat16: return artifact::v1::DTYPE_BFLOAT16;
    case DType::kFloat32: return artifact::v1::DTYPE_FLOAT32;
    case DType::kFloat64: return artifact::v1::DTYPE_FLOAT64;
  }
  return artifact::v1::DTYPE_UNSPECIFIED;
}

std::optional<DeviceType> DeviceTypeFromName(absl::string_view name) {
  if (name == "cpu") return DeviceType::kCpu;
  if (name == "cuda") return DeviceType::kCuda;
  return std::nullopt;
}

}  // namespace precompile
