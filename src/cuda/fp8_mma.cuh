// The FP8 warp-level tensor-core product (mma.sync m16n8k32 e4m3, sm_89+): on an H200 one costs an SM
// about 1.1 cycles when every warp issues them (bench/probe_tensor_rate.cu), near the FP8 peak at 8
// columns, where a wgmma m64n8k32 or m64n16k32 costs 13.
// Fragments (lane g = lane / 4, q = lane % 4): A (16 × 32, row-major) a0 = row g, K 4q..4q+3; a1 = row
// g + 8, the same K; a2, a3 = K 16 + 4q..19 + 4q of rows g, g + 8. B (32 × 8, by column) b0 = column g,
// K 4q..4q+3; b1 = K 16 + 4q..19 + 4q. D (16 × 8 f32) d0, d1 = row g, columns 2q, 2q + 1; d2, d3 = row
// g + 8.
#pragma once

#include <cstdint>

namespace nibble::cuda::fp8_mma {

// d += a · b; not volatile, so that the scheduler may interleave.
__device__ inline void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace nibble::cuda::fp8_mma
