// CPU GEMM for BF16, FP8 (W8A8) and INT4 (W4A8) weights.
#include "cpu/gemm.h"

#include <array>
#include <span>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/parallel.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// Row n of the weight as exact fp32 values (unscaled codes for quantized formats).
void weight_row(const WeightView& w, int64_t n, float* row) {
  switch (w.format) {
    case WeightFormat::kBf16: {
      const Bf16* src = static_cast<const Bf16*>(w.data) + n * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) row[k] = bf16_to_float(src[k]);
      return;
    }
    case WeightFormat::kFp8: {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + n * w.cols;
      for (int64_t k = 0; k < w.cols; ++k) row[k] = fp8_table()[src[k]];
      return;
    }
    case WeightFormat::kInt4: {
      const int32_t* src = static_cast<const int32_t*>(w.data) + n * (w.cols / kInt4PerWord);
      for (int64_t k = 0; k < w.cols; ++k) row[k] = static_cast<float>(int4_at(src, k));
      return;
    }
  }
}

}  // namespace

WeightView view_of(const Linear& w) {
  return {.format = w.format,
          .rows = w.out_features,
          .cols = w.in_features,
          .data = w.weight.raw(),
          .scale = w.format == WeightFormat::kBf16 ? nullptr : w.scale.data<float>(),
          .input_scale = w.input_scale};
}

void gemm(const float* x, int64_t tokens, const WeightView& w, float* out, const float* row_scales) {
  const int64_t K = w.cols, N = w.rows;
  const bool quantized = w.format != WeightFormat::kBf16;
  // Activations as the GPU sees them: FP8 values (exact in fp32) and one scale per token.
  std::vector<float> a(quantized ? tokens * K : 0);
  std::vector<float> act_scale(quantized ? tokens : 0);
  if (quantized) {
    std::vector<uint8_t> codes(K);
    for (int64_t t = 0; t < tokens; ++t) {
      act_scale[t] = quantize_fp8_row({x + t * K, static_cast<std::size_t>(K)}, codes,
                                      row_scales != nullptr ? row_scales[t] : w.input_scale);
      for (int64_t k = 0; k < K; ++k) a[t * K + k] = fp8_table()[codes[k]];
    }
  }
  const float* act = quantized ? a.data() : x;
  parallel_for(N, 64, [&](int64_t n) {
    std::vector<float> row(K);
    weight_row(w, n, row.data());
    for (int64_t t = 0; t < tokens; ++t) {
      const float* xt = act + t * K;
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xt[k] * row[k];
      out[t * N + n] = quantized ? acc * act_scale[t] * w.scale[n] : acc;
    }
  });
}

}  // namespace nibble
