// bfloat16 storage type and its conversions (round-to-nearest-even; NaN stays NaN).
// Host-side only; CUDA code uses __nv_bfloat16, whose bits are the same.
#pragma once

#include <bit>
#include <cstdint>

namespace nibble {

struct Bf16 {
  uint16_t bits;
};
static_assert(sizeof(Bf16) == 2);

inline float bf16_to_float(Bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }

inline Bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return Bf16{static_cast<uint16_t>(u >> 16)};
}

// IEEE half precision, for F16 checkpoints.
float f16_to_float(uint16_t bits);

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace nibble
