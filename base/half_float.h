// IEEE 754 half precision (FP16) and bfloat16 (BF16) to and from float,
// rounding to nearest even: the client tools and the server's HTTP endpoint
// read and write tensors of these types as numbers.
//
// Thread safety: pure functions.
#ifndef PRECOMPILE_BASE_HALF_FLOAT_H_
#define PRECOMPILE_BASE_HALF_FLOAT_H_

#include <cstdint>

namespace precompile {

// Every half and bfloat16 is a float exactly.
float HalfToFloat(uint16_t bits);
float BFloat16ToFloat(uint16_t bits);
// Values past the largest finite one round to infinity; NaN stays a quiet
// NaN of the same sign.
uint16_t FloatToHalf(float value);
uint16_t FloatToBFloat16(float value);

}  // namespace precompile

#endif  // PRECOMPILE_BASE_HALF_FLOAT_H_
