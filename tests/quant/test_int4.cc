// INT4 quantization and the reorder packing, pinned by hand-derived words and values.
#include <gtest/gtest.h>

#include <random>

#include "core/bf16.h"
#include "quant/int4.h"

namespace nibble {
namespace {

Tensor codes_of(std::initializer_list<int8_t> values, int64_t rows) {
  Tensor t = Tensor::zeros(DType::kI8, {rows, static_cast<int64_t>(values.size()) / rows});
  std::copy(values.begin(), values.end(), t.data<int8_t>());
  return t;
}

TEST(Int4Packing, ReorderPutsEvenElementsInTheLowHalf) {
  // Element k lands in nibble slot: 0->0, 2->1, 4->2, 6->3, 1->4, 3->5, 5->6, 7->7.
  EXPECT_EQ(static_cast<uint32_t>(pack_int4(codes_of({0, 1, 2, 3, 4, 5, 6, 7}, 1)).data<int32_t>()[0]),
            0x75316420u);
  EXPECT_EQ(static_cast<uint32_t>(pack_int4(codes_of({-1, 0, 0, 0, 0, 0, 0, 0}, 1)).data<int32_t>()[0]),
            0x0000000Fu);
  EXPECT_EQ(static_cast<uint32_t>(pack_int4(codes_of({0, -7, 0, 0, 0, 0, 0, 0}, 1)).data<int32_t>()[0]),
            0x00090000u);
  EXPECT_EQ(static_cast<uint32_t>(pack_int4(codes_of({0, 0, 0, 0, 0, 0, 0, -8}, 1)).data<int32_t>()[0]),
            0x80000000u);
}

TEST(Int4Packing, UnpackInvertsPack) {
  std::mt19937 rng(3);
  Tensor codes = Tensor::zeros(DType::kI8, {5, 64});
  for (int64_t i = 0; i < codes.numel(); ++i)
    codes.data<int8_t>()[i] = static_cast<int8_t>(std::uniform_int_distribution<int>(-8, 7)(rng));
  const Tensor packed = pack_int4(codes);
  ASSERT_EQ(packed.shape(), (Shape{5, 8}));
  const Tensor back = unpack_int4(packed);
  for (int64_t i = 0; i < codes.numel(); ++i) EXPECT_EQ(back.data<int8_t>()[i], codes.data<int8_t>()[i]);
  for (int64_t k = 0; k < 64; ++k) EXPECT_EQ(int4_at(packed.data<int32_t>() + 8, k), codes.data<int8_t>()[64 + k]);
}

TEST(Int4Quantize, PerRowScaleAndHalfEvenRounding) {
  Tensor w = Tensor::zeros(DType::kF32, {3, 8});
  const float row0[8] = {7.0f, -3.5f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -7.0f};  // amax 7: scale 1
  const float row1[8] = {0, 0, 0, 0, 0, 0, 0, 0};                              // zero row: scale 1
  const float row2[8] = {-14.0f, 1.0f, 3.0f, 5.0f, 0, 0, 0, 0};               // amax 14: scale 2
  std::copy_n(row0, 8, w.data<float>());
  std::copy_n(row1, 8, w.data<float>() + 8);
  std::copy_n(row2, 8, w.data<float>() + 16);
  const Int4Weight q = quantize_int4(w);
  EXPECT_EQ(q.scale.data<float>()[0], 1.0f);
  EXPECT_EQ(q.scale.data<float>()[1], 1.0f);
  EXPECT_EQ(q.scale.data<float>()[2], 2.0f);
  const Tensor codes = unpack_int4(q.packed);
  const int8_t expected[24] = {7, -4, 0, 2, 2, 0, -2, -7,   // -3.5 -> -4, 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
                               0, 0, 0, 0, 0, 0, 0, 0,      //
                               -7, 0, 2, 2, 0, 0, 0, 0};    // 0.5 -> 0, 1.5 -> 2, 2.5 -> 2
  for (int i = 0; i < 24; ++i) EXPECT_EQ(codes.data<int8_t>()[i], expected[i]) << i;
}

TEST(Int4Quantize, ReadsBf16AndRejectsBadShapes) {
  Tensor w = Tensor::zeros(DType::kBF16, {1, 8});
  w.data<Bf16>()[3] = float_to_bf16(-3.5f);
  const Int4Weight q = quantize_int4(w);
  EXPECT_EQ(q.scale.data<float>()[0], 0.5f);
  EXPECT_EQ(int4_at(q.packed.data<int32_t>(), 3), -7);
  EXPECT_THROW(quantize_int4(Tensor::zeros(DType::kF32, {2, 12})), Error);
}

}  // namespace
}  // namespace nibble
