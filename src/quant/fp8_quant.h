// FP8 e4m3fn quantizers: per-tensor weights (scale = amax / 448) and per-token activations
// (scale = max(amax, 1e-12) / 448), the one definition both backends follow.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace nibble {

inline constexpr float kMinActivationAmax = 1e-12f;

struct Fp8Weight {
  Tensor weight;  // F8_E4M3 (out, in)
  float scale = 1.0f;  // W ≈ weight × scale
};

// `weight` is (out, in) of F32, BF16 or F16 on the CPU. An all-zero tensor gets scale 1.
Fp8Weight quantize_fp8_per_tensor(const Tensor& weight);

// Quantizes one row of activations: out[k] = fp8(x[k] / scale); returns the scale, which is
// `static_scale` when given (values beyond ±448·scale saturate) and else max(amax, 1e-12) / 448.
float quantize_fp8_row(std::span<const float> x, std::span<uint8_t> out, float static_scale = 0.0f);

// Reads any float tensor (F32, BF16, F16, F8_E4M3 unscaled) on the CPU as fp32 values.
void to_float(const Tensor& t, std::span<float> out);
Tensor to_f32(const Tensor& t);

}  // namespace nibble
