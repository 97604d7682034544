// INT4 expert repacking on the GPU: the same transformation as repack_int4_for_gemm (its host twin in
// repack_int4.cc), from the on-disk reorder packing into the grouped GEMM's fragment layout, so that
// loading a 300B-parameter model does not spend minutes in one CPU thread.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/moe_gemm_w4a8.h"
#include "quant/int4.h"

namespace nibble::cuda {
namespace {

struct RepackArgs {
  const uint32_t* codes;  // (E, N, K/8) reorder-packed
  uint32_t* out;          // (E, N/16, K/64, 32 lanes, 4 words)
  int64_t experts, n, k;
};

// Nibble u = v + 8 of element k of a reorder-packed row.
__device__ inline uint32_t biased_nibble(const uint32_t* row, int64_t k) {
  constexpr int kSlotOf[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // inverse of the reorder [0,2,4,6,1,3,5,7]
  const uint32_t nibble = (row[k >> 3] >> (4 * kSlotOf[k & 7])) & 0xFu;
  return (nibble ^ 0x8u);  // two's-complement v in [-8, 7] -> v + 8 in [0, 15]
}

// One thread per output word.
__global__ void repack_kernel(const __grid_constant__ RepackArgs a) {
  const int64_t words_per_expert = a.n * a.k / 8, total = a.experts * words_per_expert;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = w / words_per_expert;
    int64_t r = w % words_per_expert;
    const int j = static_cast<int>(r % 4), lane = static_cast<int>((r / 4) % 32);
    r /= 128;
    const int64_t kblocks = a.k / kGemmKBlock, kb = r % kblocks, t = r / kblocks;
    const int g = lane >> 2, q = lane & 3, s = j >> 1, h = j & 1;
    const int64_t c0 = kb * kGemmKBlock + 32 * s + 16 * h + 4 * q;
    const uint32_t* row_lo = a.codes + (e * a.n + 16 * t + g) * (a.k / 8);
    const uint32_t* row_hi = row_lo + 8 * (a.k / 8);
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b)
      word |= biased_nibble(row_lo, c0 + b) << (8 * b) | biased_nibble(row_hi, c0 + b) << (8 * b + 4);
    a.out[w] = word;
  }
}

}  // namespace

Tensor repack_int4_for_gemm_gpu(const Tensor& codes) {
  expect(codes, DType::kI32, {-1, -1, -1}, "repack_int4_for_gemm_gpu codes");
  check(codes.device() == Device::kCuda, "repack_int4_for_gemm_gpu: codes must be on the GPU");
  const int64_t E = codes.dim(0), N = codes.dim(1), K = codes.dim(2) * kInt4PerWord;
  check(N % 16 == 0, "INT4 GEMM: output size ", N, " is not a multiple of 16");
  check(K % kGemmKBlock == 0, "INT4 GEMM: input size ", K, " is not a multiple of ", kGemmKBlock);
  Tensor out = empty(DType::kU8, {E, N * K / 2});
  const RepackArgs args{.codes = static_cast<const uint32_t*>(codes.raw()), .out = static_cast<uint32_t*>(out.raw()),
                        .experts = E, .n = N, .k = K};
  const int64_t words = E * N * K / 8;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((words + 255) / 256, 65536));
  repack_kernel<<<blocks, 256>>>(args);
  cuda_check(cudaGetLastError());
  cuda_check(cudaDeviceSynchronize());
  return out;
}

}  // namespace nibble::cuda
