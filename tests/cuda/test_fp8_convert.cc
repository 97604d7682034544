// CUDA FP8 conversions against the CPU twin (core/fp8.h): every code, and random floats across
// the whole range, including ties, subnormals and values past ±448.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/fp8.h"
#include "cuda/device.h"
#include "cuda/fp8_convert.h"
#include "gpu_test_util.h"

namespace nibble {
namespace {

TEST(CudaFp8, DecodesEveryCodeLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  Tensor codes = Tensor::zeros(DType::kF8E4M3, {256});
  for (int i = 0; i < 256; ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(i);
  Tensor out = cuda::empty(DType::kF32, {256});
  cuda::dequantize_fp8(cuda::upload(codes), 1.0f, out);
  const Tensor host = cuda::download(out);
  for (int i = 0; i < 256; ++i) {
    const float expected = fp8_e4m3_to_float(static_cast<uint8_t>(i));
    if (std::isnan(expected))
      EXPECT_TRUE(std::isnan(host.data<float>()[i])) << i;
    else
      EXPECT_EQ(host.data<float>()[i], expected) << i;
  }
}

TEST(CudaFp8, EncodesLikeTheCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const int64_t n = 1 << 16;
  Tensor x = Tensor::zeros(DType::kF32, {n});
  for (int64_t i = 0; i < n; ++i) {
    // Magnitudes from 2^-12 to 2^10, both signs; every 16th an exact tie between two codes.
    const float mag = std::ldexp(1.0f + std::uniform_real_distribution<float>(0, 1)(rng),
                                 std::uniform_int_distribution<int>(-12, 10)(rng));
    float v = (i & 1) ? -mag : mag;
    if (i % 16 == 0) v = fp8_e4m3_to_float(static_cast<uint8_t>(i / 16 % 126)) * 1.0625f;
    x.data<float>()[i] = v;
  }
  Tensor q = cuda::empty(DType::kF8E4M3, {n});
  cuda::quantize_fp8(cuda::upload(x), 0.75f, q);
  const Tensor host = cuda::download(q);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(host.data<uint8_t>()[i], float_to_fp8_e4m3(x.data<float>()[i] / 0.75f)) << x.data<float>()[i];
}

}  // namespace
}  // namespace nibble
