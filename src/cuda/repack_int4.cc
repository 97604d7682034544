// Host-side repacking of INT4 expert weights from the on-disk reorder packing into the grouped GEMM's
// fragment layout (see moe_gemm_w4a8.h).
#include <cstring>

#include "cuda/moe_gemm_w4a8.h"
#include "quant/int4.h"

namespace nibble::cuda {

Tensor repack_int4_for_gemm(const Tensor& codes) {
  expect(codes, DType::kI32, {-1, -1, -1}, "repack_int4_for_gemm codes");
  const int64_t E = codes.dim(0), N = codes.dim(1), K = codes.dim(2) * kInt4PerWord;
  check(N % 16 == 0, "INT4 GEMM: output size ", N, " is not a multiple of 16");
  check(K % kGemmKBlock == 0, "INT4 GEMM: input size ", K, " is not a multiple of ", kGemmKBlock);
  const int64_t tiles = N / 16, kblocks = K / kGemmKBlock;
  Tensor out = Tensor::zeros(DType::kU8, {E, N * K / 2});
  for (int64_t e = 0; e < E; ++e) {
    const int32_t* src = codes.data<int32_t>() + e * N * (K / kInt4PerWord);
    auto* dst = reinterpret_cast<uint32_t*>(out.data<uint8_t>() + e * N * K / 2);
    // u = v + 8 of row n, column k.
    auto u = [&](int64_t n, int64_t k) {
      return static_cast<uint32_t>(int4_at(src + n * (K / kInt4PerWord), k) + 8);
    };
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t kb = 0; kb < kblocks; ++kb)
        for (int lane = 0; lane < 32; ++lane)
          for (int j = 0; j < 4; ++j) {
            const int g = lane >> 2, q = lane & 3, s = j >> 1, h = j & 1;
            const int64_t c0 = kb * kGemmKBlock + 32 * s + 16 * h + 4 * q;
            uint32_t word = 0;
            for (int b = 0; b < 4; ++b) {
              word |= u(16 * t + g, c0 + b) << (8 * b);          // low nibble of byte b: row g
              word |= u(16 * t + g + 8, c0 + b) << (8 * b + 4);  // high nibble: row g + 8
            }
            *dst++ = word;
          }
  }
  return out;
}

}  // namespace nibble::cuda
