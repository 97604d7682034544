// bfloat16 and fp16 conversions pinned by hand-derived values.
#include <gtest/gtest.h>

#include <cmath>

#include "core/bf16.h"

namespace nibble {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);      // tie: even (down)
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3F82);  // tie: even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits, 0x3F81);
  EXPECT_EQ(float_to_bf16(-2.0f).bits, 0xC000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7F80);
  EXPECT_EQ(bf16_to_float(Bf16{0x4049}), 3.140625f);
}

TEST(F16, DecodesHandPickedValues) {
  EXPECT_EQ(f16_to_float(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_float(0xC000), -2.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_float(0x7BFF), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_float(0x7C00)));
  EXPECT_TRUE(std::isnan(f16_to_float(0x7E00)));
}

}  // namespace
}  // namespace nibble
