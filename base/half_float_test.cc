#include "base/half_float.h"

#include <gtest/gtest.h>

#include <cmath>

namespace precompile {
namespace {

TEST(HalfPrecision, RoundTripsEveryHalfAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      EXPECT_EQ(FloatToHalf(f), bits) << std::hex << bits;
    }
  }
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // A tie: to even, zero.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // A tie: to even.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(BFloat16, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (!std::isnan(f)) EXPECT_EQ(FloatToBFloat16(f), bits) << std::hex << bits;
  }
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // A tie: to even.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
}

}  // namespace
}  // namespace precompile
