// The CPU GEMM twin against a double-precision evaluation of its definition (DESIGN.md §2):
// dequantized FP8 activations times dequantized INT4/FP8 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/gemm.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

Tensor random_matrix(int64_t rows, int64_t cols, uint32_t seed, float spread = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  Tensor t = Tensor::zeros(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

double rel_l2(const std::vector<double>& ref, const float* got) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    num += (ref[i] - got[i]) * (ref[i] - got[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

TEST(CpuGemm, W4A8MatchesItsDefinition) {
  const int64_t T = 5, N = 24, K = 256;
  const Tensor x = random_matrix(T, K, 1), w = random_matrix(N, K, 2, 0.05f);
  const Int4Weight q = quantize_int4(w);
  std::vector<float> out(T * N);
  gemm(x.data<float>(), T, {.format = WeightFormat::kInt4, .rows = N, .cols = K, .data = q.packed.raw(),
                            .scale = q.scale.data<float>()}, out.data());
  std::vector<double> ref(T * N);
  for (int64_t t = 0; t < T; ++t) {
    double amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(double{x.data<float>()[t * K + k]}));
    const float s = static_cast<float>(amax / 448.0);
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double{fp8_e4m3_to_float(float_to_fp8_e4m3(x.data<float>()[t * K + k] / s))} *
               int4_at(q.packed.data<int32_t>() + n * K / 8, k);
      ref[t * N + n] = acc * s * q.scale.data<float>()[n];
    }
  }
  EXPECT_LT(rel_l2(ref, out.data()), 1e-6);
  // And W4A8 approximates the float product within the quantization error (a few percent).
  std::vector<double> exact(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k)
        exact[t * N + n] += double{x.data<float>()[t * K + k]} * w.data<float>()[n * K + k];
  EXPECT_LT(rel_l2(exact, out.data()), 0.15);
}

TEST(CpuGemm, Fp8StaticInputScaleSaturates) {
  const int64_t K = 8;
  std::vector<float> x{1, 2, 3, 4, -5, 6, 7, 100};
  Tensor w = Tensor::zeros(DType::kF8E4M3, {1, K});
  for (int64_t k = 0; k < K; ++k) w.data<uint8_t>()[k] = float_to_fp8_e4m3(1.0f);
  const float scale = 2.0f;
  float out = 0;
  gemm(x.data(), 1, {.format = WeightFormat::kFp8, .rows = 1, .cols = K, .data = w.raw(), .scale = &scale,
                     .input_scale = 0.1f}, &out);
  // x / 0.1 in FP8: 10, 20, 30, 40 exact; -50 -> -48 (tie to even); 60 exact; 70 -> 72; 1000
  // saturates to 448. Sum 632, times the input scale 0.1 and the weight scale 2: 126.4.
  EXPECT_NEAR(out, 126.4f, 1e-3f);
}

TEST(CpuGemm, Bf16IsAPlainProduct) {
  const int64_t T = 3, N = 7, K = 16;
  const Tensor x = random_matrix(T, K, 4);
  Tensor w = Tensor::zeros(DType::kBF16, {N, K});
  const Tensor wf = random_matrix(N, K, 5);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<Bf16>()[i] = float_to_bf16(wf.data<float>()[i]);
  std::vector<float> out(T * N);
  gemm(x.data<float>(), T, {.format = WeightFormat::kBf16, .rows = N, .cols = K, .data = w.raw()}, out.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double{x.data<float>()[t * K + k]} * bf16_to_float(w.data<Bf16>()[n * K + k]);
      EXPECT_NEAR(out[t * N + n], acc, 1e-5);
    }
}

}  // namespace
}  // namespace nibble
