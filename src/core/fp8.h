// OCP FP8 e4m3fn (bias 7, max 448, no infinities, NaN = 0x7F/0xFF) and its conversions.
// Encoding rounds to nearest even and saturates finite values to ±448 (NaN stays NaN).
// Also converts ROCm's e4m3fnuz (bias 8, max 240, NaN = 0x80) checkpoints to e4m3fn.
#pragma once

#include <cstdint>

namespace nibble {

inline constexpr float kFp8E4M3Max = 448.0f;

float fp8_e4m3_to_float(uint8_t bits);
uint8_t float_to_fp8_e4m3(float value);

// e4m3fnuz bits -> e4m3fn bits holding twice the fnuz value (the biases differ by one), so the caller
// halves the tensor's scale. Same bits, except 0x80 (fnuz NaN) -> 0 and ±240 (fnuz 0x7F/0xFF, NaN in
// fn) saturate to ±448.
uint8_t fp8_e4m3fnuz_to_e4m3fn(uint8_t bits);

inline float round_to_fp8_e4m3(float value) { return fp8_e4m3_to_float(float_to_fp8_e4m3(value)); }

}  // namespace nibble
