// FP8 e4m3fn conversions pinned by hand-derived values: every code's value, ties to even, saturation.
#include <gtest/gtest.h>

#include <cmath>

#include "core/fp8.h"

namespace nibble {
namespace {

// Value of a code from the OCP definition, in double: (-1)^s × 2^(e-7) × (1 + m/8), subnormal
// 2^-6 × m/8, and S.1111.111 is NaN.
double ocp_value(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(Fp8, HandPickedCodes) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x3C), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_float(0x40), 2.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0xFE), -448.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xFF)));
  EXPECT_FALSE(std::isnan(fp8_e4m3_to_float(0x78)));  // 256: e=15 is a normal binade in e4m3fn
  EXPECT_EQ(fp8_e4m3_to_float(0x78), 256.0f);
}

TEST(Fp8, AllCodesDecodeAndRoundTrip) {
  for (int code = 0; code < 256; ++code) {
    const double expected = ocp_value(code);
    const float got = fp8_e4m3_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << code;
      EXPECT_EQ(float_to_fp8_e4m3(got) & 0x7F, 0x7F) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), expected) << code;
    EXPECT_EQ(float_to_fp8_e4m3(got), code) << code;  // every value encodes to its own code
  }
}

TEST(Fp8, TiesRoundToEven) {
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);   // between 1.0 (m=0) and 1.125 (m=1): even is 1.0
  EXPECT_EQ(float_to_fp8_e4m3(1.1875f), 0x3A);   // between 1.125 (m=1) and 1.25 (m=2): 1.25
  EXPECT_EQ(float_to_fp8_e4m3(-1.0625f), 0xB8);
  EXPECT_EQ(float_to_fp8_e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal: 0
  EXPECT_EQ(float_to_fp8_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 subnormal steps: 2
  EXPECT_EQ(float_to_fp8_e4m3(15 * std::ldexp(1.0f, -10)), 0x08);  // 7.5 steps: the smallest normal
  EXPECT_EQ(float_to_fp8_e4m3(1.0625001f), 0x39);  // just above the tie rounds up
  EXPECT_EQ(float_to_fp8_e4m3(240.0f), 0x77);      // 240 = 1.875 × 2^7
  EXPECT_EQ(float_to_fp8_e4m3(248.0f), 0x78);      // tie between 240 (m=7) and 256 (m=0 next binade)
}

TEST(Fp8, OverflowSaturates) {
  EXPECT_EQ(float_to_fp8_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(463.99f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(464.0f), 0x7E);  // tie with the (absent) 480: still 448
  EXPECT_EQ(float_to_fp8_e4m3(1e10f), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-1e10f), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(float_to_fp8_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_fp8_e4m3(NAN), 0x7F);
}

TEST(Fp8, FnuzConversionDoublesTheValue) {
  // fnuz 0x38 = 2^(7-8) = 0.5; the same bits in fn are 1.0, so the scale is halved by the loader.
  EXPECT_EQ(fp8_e4m3fnuz_to_e4m3fn(0x38), 0x38);
  EXPECT_EQ(fp8_e4m3fnuz_to_e4m3fn(0x80), 0x00);  // fnuz NaN -> 0
  EXPECT_EQ(fp8_e4m3fnuz_to_e4m3fn(0x7F), 0x7E);  // fnuz 240 -> fn 448 (saturated from 480)
  EXPECT_EQ(fp8_e4m3fnuz_to_e4m3fn(0xFF), 0xFE);
  EXPECT_EQ(fp8_e4m3fnuz_to_e4m3fn(0x01), 0x01);
}

}  // namespace
}  // namespace nibble
