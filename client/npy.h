// NumPy .npy files (format versions 1.0, 2.0 and 3.0) as client tensors, so
// that inputs can come from and outputs go to numpy without a conversion
// step. Only what a tensor can be is accepted: little-endian (or one-byte),
// C-order arrays of bool, uint8/16/32/64, int8/16/32/64, float16/32/64.
// bfloat16 has no .npy dtype, so BF16 tensors are refused on write.
// Written here because Debian's one C++ .npy codec, xtensor's xnpy.hpp
// (libxtensor-dev), reads and writes only an element type fixed at compile
// time and has no float16, while a tensor's datatype is known at run time.
//
// Thread safety: free functions without shared state.
#ifndef PRECOMPILE_CLIENT_NPY_H_
#define PRECOMPILE_CLIENT_NPY_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/tensor.h"

namespace precompile::client {

// The contents of a .npy file as a tensor (its name left empty).
// INVALID_ARGUMENT says what is wrong: not a .npy file, a truncated one, an
// unsupported dtype (big-endian, object, structured, ...) or Fortran order.
absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes);

// ParseNpy of the file at `path`; errors name the path. NOT_FOUND when the
// file cannot be read.
absl::StatusOr<Tensor> ReadNpy(const std::string& path);

// The .npy bytes of `tensor`: format 1.0, or 2.0 when the header needs it.
// INVALID_ARGUMENT for a BF16 tensor, or one whose bytes do not match its
// shape.
absl::StatusOr<std::string> SerializeNpy(const Tensor& tensor);

// Writes SerializeNpy(tensor) to `path` (replacing it). Errors name the path.
absl::Status WriteNpy(const std::string& path, const Tensor& tensor);

// The .npy dtype descriptor of a datatype ("FP32" -> "<f4") and back.
absl::StatusOr<std::string> NpyDescrOf(absl::string_view datatype);
absl::StatusOr<std::string> DatatypeOfNpyDescr(absl::string_view descr);

}  // namespace precompile::client

#endif  // PRECOMPILE_CLIENT_NPY_H_
