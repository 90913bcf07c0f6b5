// The element types the runtime serves, independent of torch.
#ifndef PRECOMPILE_RUNTIME_DTYPE_H_
#define PRECOMPILE_RUNTIME_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include "absl/strings/string_view.h"

#include "proto/artifact.pb.h"

namespace precompile {

enum class DType : uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

enum class DeviceType : uint8_t { kCpu, kCuda };

// torch's name for the dtype: "float32", "int64", "bfloat16", ...
absl::string_view DTypeName(DType dtype);
absl::string_view DeviceTypeName(DeviceType device);
size_t DTypeSize(DType dtype);

// nullopt for DTYPE_UNSPECIFIED or a value this build does not know.
std::optional<DType> DTypeFromProto(artifact::v1::DType dtype);
artifact::v1::DType DTypeToProto(DType dtype);
// "cpu" or "cuda"; nullopt otherwise.
std::optional<DeviceType> DeviceTypeFromName(absl::string_view name);

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_DTYPE_H_
