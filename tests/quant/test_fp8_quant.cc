// FP8 weight and activation quantizers.
#include <gtest/gtest.h>

#include "core/fp8.h"
#include "quant/fp8_quant.h"

namespace nibble {
namespace {

TEST(Fp8Quant, PerTensorScaleIsAmaxOver448) {
  Tensor w = Tensor::zeros(DType::kF32, {2, 2});
  const float values[4] = {1.0f, -8.96f, 0.0f, 4.48f};
  std::copy_n(values, 4, w.data<float>());
  const Fp8Weight q = quantize_fp8_per_tensor(w);
  EXPECT_FLOAT_EQ(q.scale, 8.96f / 448.0f);
  EXPECT_EQ(q.weight.data<uint8_t>()[1], 0xFE);  // the amax maps to -448
  EXPECT_EQ(fp8_e4m3_to_float(q.weight.data<uint8_t>()[3]), 224.0f);
  EXPECT_EQ(quantize_fp8_per_tensor(Tensor::zeros(DType::kF32, {3, 3})).scale, 1.0f);
}

TEST(Fp8Quant, ActivationRows) {
  const float x[4] = {0.5f, -2.0f, 1.0f, 0.0f};
  uint8_t out[4];
  const float scale = quantize_fp8_row(x, out, 0.0f);
  EXPECT_FLOAT_EQ(scale, 2.0f / 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(out[1]), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(out[0]), 112.0f);
  // A static scale saturates what lies beyond it.
  EXPECT_EQ(quantize_fp8_row(x, out, 1.0f / 448.0f), 1.0f / 448.0f);
  EXPECT_EQ(out[1], 0xFE);
  // An all-zero row gets the floor scale and zero codes.
  const float zeros[2] = {0.0f, 0.0f};
  EXPECT_FLOAT_EQ(quantize_fp8_row(zeros, out, 0.0f), 1e-12f / 448.0f);
  EXPECT_EQ(out[0], 0);
}

}  // namespace
}  // namespace nibble
