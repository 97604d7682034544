// The f16 tensor-core forms of INT4 × FP8 products (mma.sync m16n8k16, fp32 sums), shared by the
// decode MoE GEMM's mma.sync path (moe_gemm_w4a8.cu).
// Weights: in the repacked layout (moe_gemm_w4a8.h) lane (g, q)'s 32-bit word of a 16-wide K step
// holds K 4q + i in byte i, row g in the low nibble and row g + 8 in the high one, each nibble
// u = v + 8. Masked in place, a nibble is the f16 subnormal u · 2^-24 (low) or u · 2^-20 (high),
// exact. The fragment's logical K 2q, 2q + 1 are physical K 4q, 4q + 2 and its 2q + 8, 2q + 9 are
// 4q + 1, 4q + 3; activations are read in the same order. Sums: rows g carry 2^-24 Σ u·a, rows g + 8
// 2^-20 Σ u·a (kLowScale, kHighScale undo them).
#pragma once

#include <cstdint>

namespace nibble::cuda::int4_f16 {

inline constexpr float kLowScale = 16777216.0f;  // 2^24: accumulators 0 and 1 (rows g)
inline constexpr float kHighScale = 1048576.0f;  // 2^20: accumulators 2 and 3 (rows g + 8)

// Two FP8 e4m3 values (low byte first) as two f16 (exact).
__device__ inline uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t r;
  asm("{\n.reg .b16 v;\ncvt.u16.u32 v, %1;\ncvt.rn.f16x2.e4m3x2 %0, v;\n}\n" : "=r"(r) : "r"(two_bytes));
  return r;
}

// The B fragment (f16) of one 8-row tile for a K step from this lane's 4 FP8 bytes (K 4q..4q+3 of
// row g).
__device__ inline void activation_fragment(uint32_t four_bytes, uint32_t (&b)[2]) {
  const uint32_t y = __byte_perm(four_bytes, 0, 0x3120);  // bytes 0, 2, 1, 3
  b[0] = e4m3x2_to_f16x2(y & 0xFFFFu);
  b[1] = e4m3x2_to_f16x2(y >> 16);
}

// The A fragment (f16) of one 16-row tile for a K step from this lane's weight word.
__device__ inline void weight_fragment(uint32_t word, uint32_t (&a)[4]) {
  const uint32_t odd = word >> 8;
  a[0] = word & 0x000F000Fu;
  a[1] = word & 0x00F000F0u;
  a[2] = odd & 0x000F000Fu;
  a[3] = odd & 0x00F000F0u;
}

// d (16×8 f32) += a (16×16 f16) · b (16×8 f16); not volatile, so that the scheduler may interleave.
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace nibble::cuda::int4_f16
