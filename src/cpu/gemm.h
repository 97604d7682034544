// The CPU GEMM twin of every matrix product nibble runs: out (T, N) = x (T, K) · Wᵀ for W in BF16,
// FP8 or INT4. Quantized formats emulate the GPU exactly: x is quantized to FP8 per token (or with a
// static per-tensor scale), the products of FP8 and INT4/FP8 values are summed in fp32, and the sum is
// multiplied by act_scale[t] × scale[n] afterwards.
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace nibble {

// A weight matrix (N, K) in one format: one Linear, or one expert's slice of an Experts tensor.
struct WeightView {
  WeightFormat format = WeightFormat::kBf16;
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  const void* data = nullptr;   // BF16 (N, K), F8_E4M3 (N, K) or I32 (N, K/8)
  const float* scale = nullptr;  // (N), quantized formats only
  float input_scale = 0.0f;      // static activation scale, 0 = dynamic per token
};

WeightView view_of(const Linear& w);

// x: (T, K) fp32 row-major; out: (T, N) fp32 row-major. row_scales (T), quantized formats only: each
// row's FP8 activation scale, given (instead of the weight's static one or the row's own amax).
void gemm(const float* x, int64_t tokens, const WeightView& w, float* out, const float* row_scales = nullptr);

}  // namespace nibble
