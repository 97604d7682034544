// Expert weight repacking on the GPU, into the grouped GEMM's fragment layouts: INT4 from the on-disk
// reorder packing (the same transformation as its host twin repack_int4_for_gemm in repack_int4.cc),
// so that loading a 300B-parameter model does not spend minutes in one CPU thread; and FP8.
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

struct RepackFp8Args {
  const uint8_t* codes;  // (E, N, K)
  uint32_t* out;         // (E, N/16, K/64, 32 lanes, 8 words)
  int64_t experts, n, k;
};

// One thread per output word: word 4s + r of a lane holds row g + 8·(r & 1), columns 32s + 16·(r >> 1) + 4q.
__global__ void repack_fp8_kernel(const __grid_constant__ RepackFp8Args a) {
  const int64_t words_per_expert = a.n * a.k / 4, total = a.experts * words_per_expert;
  for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < total; w += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = w / words_per_expert;
    int64_t r = w % words_per_expert;
    const int word = static_cast<int>(r % 8), lane = static_cast<int>((r / 8) % 32);
    r /= 256;
    const int64_t kblocks = a.k / kGemmKBlock, kb = r % kblocks, t = r / kblocks;
    const int g = lane >> 2, q = lane & 3, s = word >> 2, rr = word & 3;
    const int64_t row = 16 * t + g + 8 * (rr & 1), col = kb * kGemmKBlock + 32 * s + 16 * (rr >> 1) + 4 * q;
    const uint8_t* src = a.codes + (e * a.n + row) * a.k + col;
    a.out[w] = uint32_t{src[0]} | uint32_t{src[1]} << 8 | uint32_t{src[2]} << 16 | uint32_t{src[3]} << 24;
  }
}

}  // namespace

Tensor repack_fp8_for_gemm_gpu(const Tensor& codes) {
  check((codes.dtype() == DType::kF8E4M3 || codes.dtype() == DType::kU8) && codes.rank() == 3,
        "repack_fp8_for_gemm_gpu: codes are ", codes.describe(), ", expected FP8 (E, N, K)");
  check(codes.device() == Device::kCuda, "repack_fp8_for_gemm_gpu: codes must be on the GPU");
  const int64_t E = codes.dim(0), N = codes.dim(1), K = codes.dim(2);
  check(N % 16 == 0, "FP8 grouped GEMM: output size ", N, " is not a multiple of 16");
  check(K % kGemmKBlock == 0, "FP8 grouped GEMM: input size ", K, " is not a multiple of ", kGemmKBlock);
  Tensor out = empty(DType::kU8, {E, N * K});
  const RepackFp8Args args{.codes = static_cast<const uint8_t*>(codes.raw()), .out = static_cast<uint32_t*>(out.raw()),
                           .experts = E, .n = N, .k = K};
  const int64_t words = E * N * K / 4;
  repack_fp8_kernel<<<static_cast<unsigned>(std::min<int64_t>((words + 255) / 256, 65536)), 256, 0,
                      compute_stream()>>>(args);
  cuda_check(cudaGetLastError());
  cuda_check(cudaStreamSynchronize(compute_stream()));
  return out;
}

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
  repack_kernel<<<blocks, 256, 0, compute_stream()>>>(args);
  cuda_check(cudaGetLastError());
  cuda_check(cudaStreamSynchronize(compute_stream()));
  return out;
}

}  // namespace nibble::cuda
