// Conversions of the scalar storage types (fp8 e4m3fn, fp16).
#include <algorithm>
#include <bit>
#include <limits>
#include <cmath>
#include <cstdint>

#include "core/bf16.h"
#include "core/fp8.h"

namespace nibble {

float fp8_e4m3_to_float(uint8_t bits) {
  const int sign = bits >> 7;
  const int exponent = (bits >> 3) & 0xF;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^-6
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return sign ? -magnitude : magnitude;
}

uint8_t float_to_fp8_e4m3(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  if (std::isnan(value)) return 0x7F | sign;
  float a = std::fabs(value);
  if (a >= kFp8E4M3Max) return sign | 0x7E;  // saturate (infinity included)
  // Quantum of the binade containing `a`: 2^(e-3) for normals (e >= -6), 2^-9 for subnormals.
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  const int exponent = std::max(e - 1, -6);
  const float quantum = std::ldexp(1.0f, exponent - 3);
  const float steps = std::nearbyint(a / quantum);  // exact division by a power of two; RNE
  const float rounded = steps * quantum;
  if (rounded >= kFp8E4M3Max) return sign | 0x7E;
  if (rounded == 0.0f) return sign;
  int re = 0;
  std::frexp(rounded, &re);
  const int biased = (re - 1) + 7;
  if (biased <= 0) {  // subnormal: value = m * 2^-9
    return sign | static_cast<uint8_t>(std::ldexp(rounded, 9));
  }
  const int mantissa = static_cast<int>(std::ldexp(rounded, -(re - 1)) * 8.0f) - 8;
  return sign | static_cast<uint8_t>(biased << 3) | static_cast<uint8_t>(mantissa);
}

uint8_t fp8_e4m3fnuz_to_e4m3fn(uint8_t bits) {
  if (bits == 0x80) return 0;
  if ((bits & 0x7F) == 0x7F) return (bits & 0x80) | 0x7E;
  return bits;
}

float f16_to_float(uint16_t bits) {
  const int sign = bits >> 15;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 0x1F) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN()
                         : std::numeric_limits<float>::infinity();
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 1024.0f, exponent - 15);
  }
  return sign ? -magnitude : magnitude;
}

}  // namespace nibble
