// The runtime's dtypes as torch's scalar types, and back.
#ifndef PRECOMPILE_RUNTIME_TORCH_DTYPE_H_
#define PRECOMPILE_RUNTIME_TORCH_DTYPE_H_

#include <c10/core/ScalarType.h>

#include <optional>

#include "runtime/dtype.h"

namespace precompile {

// nullopt for a scalar type the runtime does not serve (complex, float8...).
inline std::optional<DType> FromScalarType(c10::ScalarType t) {
  switch (t) {
    case c10::kBool: return DType::kBool;
    case c10::kByte: return DType::kUInt8;
    case c10::kChar: return DType::kInt8;
    case c10::kShort: return DType::kInt16;
    case c10::kInt: return DType::kInt32;
    case c10::kLong: return DType::kInt64;
    case c10::kHalf: return DType::kFloat16;
    case c10::kBFloat16: return DType::kBFloat16;
    case c10::kFloat: return DType::kFloat32;
    case c10::kDouble: return DType::kFloat64;
    default: return std::nullopt;
  }
}

inline c10::ScalarType ToScalarType(DType t) {
  switch (t) {
    case DType::kBool: return c10::kBool;
    case DType::kUInt8: return c10::kByte;
    case DType::kInt8: return c10::kChar;
    case DType::kInt16: return c10::kShort;
    case DType::kInt32: return c10::kInt;
    case DType::kInt64: return c10::kLong;
    case DType::kFloat16: return c10::kHalf;
    case DType::kBFloat16: return c10::kBFloat16;
    case DType::kFloat32: return c10::kFloat;
    case DType::kFloat64: return c10::kDouble;
  }
  return c10::kFloat;
}

}  // namespace precompile

#endif  // PRECOMPILE_RUNTIME_TORCH_DTYPE_H_
