// The MoE decode GEMM's stage chain alone, with nothing else in the loop: how many SM cycles one
// chain of eight wgmma m64nNk32 e4m3 (A from registers, B from shared memory) costs when each block's
// warpgroup issues it, commits, waits for it and adds its sums to fp32 registers, at one to three
// blocks an SM. B either as the GEMM lays out a stage's activations (slots of two 128-byte-swizzled
// halves of 64 rows, the chain walking the stage's four K blocks and the slots in turn) or one small
// unswizzled tile read by every wgmma (as probe_tensor_rate.cu); A either the same registers every
// chain or new ones each (the INT4 masks of moe_gemm_w4a8.cu applied to a changing word). Not part of
// the build (a measurement tool):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/probe_chain_rate.cu -o /tmp/probe_chain
//   /tmp/probe_chain
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/wgmma.cuh"
#include "probe_blocks.cuh"

namespace {

namespace wg = nibble::cuda::wgmma;

constexpr int kIters = 2048;
constexpr int kRows = 64, kHalfBytes = kRows * 128, kSlotBytes = 2 * kHalfBytes, kSlots = 4;
constexpr int kSmemBytes = kSlots * kSlotBytes + 1024;

template <int N, bool kSwizzled, bool kVaryA>
__global__ void __launch_bounds__(128) chain_rate(long long* cycles, float* sink) {
  extern __shared__ uint8_t raw[];
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 1023;
  uint8_t* slots = raw + ((1024 - misalign) & 1023);
  for (int i = threadIdx.x; i < kSlots * kSlotBytes; i += blockDim.x) slots[i] = static_cast<uint8_t>(i * 7);
  __syncthreads();
  wg::fence_proxy_async();
  __syncthreads();
  const uint64_t desc = kSwizzled ? wg::descriptor_sw128(slots) : wg::descriptor(slots, 128, 512);
  const auto desc_lo = static_cast<uint32_t>(desc);
  const uint64_t desc_hi = desc & 0xFFFFFFFF00000000ull;
  uint32_t word = threadIdx.x * 0x01010101u;
  uint32_t a[4][2][4];
#pragma unroll
  for (int b = 0; b < 4; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[b][h][i] = (word >> (4 * (i & 1))) & 0x0F0F0F0Fu;
  float acc[N / 2] = {};
  float d[N / 2];
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    const int slot = it % kSlots;
    if constexpr (kVaryA) nibble::probe::next_a_fragments(word, a);
    wg::fence();
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t lo = kSwizzled ? desc_lo + ((slot * kSlotBytes + (b / 2) * kHalfBytes + (b % 2) * 64) >> 4) : desc_lo;
      wg::WgmmaE4m3<N>::mma(d, a[b][0], desc_hi | lo, b);
      wg::WgmmaE4m3<N>::mma(d, a[b][1], desc_hi | (lo + (kSwizzled ? 2 : 0)), 1);
    }
    wg::commit();
    wg::wait<0>();
#pragma unroll
    for (int j = 0; j < N / 2; ++j) acc[j] += d[j];
  }
  nibble::probe::finish_block(start, acc, cycles, sink);
}

template <int N, bool kSwizzled, bool kVaryA>
void report(int blocks_per_sm) {
  const auto t = nibble::probe::time_blocks(chain_rate<N, kSwizzled, kVaryA>, blocks_per_sm, 128, kSmemBytes);
  const double per_chain = static_cast<double>(t.most_cycles) / kIters;  // a block's chain, wall cycles
  std::printf("n%-3d %-10s %-8s %d blocks/SM: %7.1f cycles a block's chain, %7.1f SM cycles a chain (%s)\n", N,
              kSwizzled ? "sw128" : "one-tile", kVaryA ? "new A" : "same A", blocks_per_sm, per_chain,
              per_chain / blocks_per_sm, cudaGetErrorString(cudaGetLastError()));
}

template <int N>
void report_all() {
  for (int bps : {1, 2, 3}) {
    report<N, false, false>(bps);
    report<N, true, false>(bps);
    report<N, true, true>(bps);
  }
}

}  // namespace

int main() {
  report_all<32>();
  report_all<64>();
  return 0;
}
