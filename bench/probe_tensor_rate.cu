// Tensor-core issue rates for the skinny shapes of the MoE decode GEMM: how many cycles of an SM one
// instruction costs when every warp issues chains of it (wgmma m64nNk32 e4m3 with A from registers,
// mma.sync m16n8k16 f16). Measured on an H200 (bench/RESULTS.md, 2026-11-30): a wgmma m64n8k32 or
// m64n16k32 costs 13 cycles, m64n32k32 16, m64n64k32 32 (the FP8 peak, 4096 MAC a cycle); an mma.sync
// m16n8k16 f16 1.5. (An mma.sync m16n8k32 e4m3 is no FP8 instruction on sm_90: ptxas makes it f16
// conversions and two HMMA.16816.) Not part of the build (a measurement tool):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/probe_tensor_rate.cu -o /tmp/probe
//   /tmp/probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "cuda/wgmma.cuh"

namespace {

constexpr int kIters = 4096;

// One warpgroup a group of 128 threads; each issues kIters × kChain wgmmas: kChains independent
// accumulators, kChain/kChains deep each, one commit and wait a round.
template <int N, int kChains>
__global__ void wgmma_rate(long long* cycles, float* sink) {
  __shared__ alignas(128) uint8_t b[N * 64];
  for (int i = threadIdx.x; i < N * 64; i += blockDim.x) b[i] = 0;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t a[4] = {threadIdx.x, 0, 0, 0};
  const uint64_t desc = nibble::cuda::wgmma::descriptor(b, 128, 512);
  float d[kChains][N / 2] = {};
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    nibble::cuda::wgmma::fence();
#pragma unroll
    for (int s = 0; s < 8 / kChains; ++s)
#pragma unroll
      for (int c = 0; c < kChains; ++c) nibble::cuda::wgmma::WgmmaE4m3<N>::mma(d[c], a, desc, 1);
    nibble::cuda::wgmma::commit();
    nibble::cuda::wgmma::wait<0>();
  }
  const long long stop = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  float s = 0;
  for (int c = 0; c < kChains; ++c)
    for (int j = 0; j < N / 2; ++j) s += d[c][j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// mma.sync f16: 8 independent accumulators a warp, kIters rounds.
__global__ void mma_rate(long long* cycles, float* sink) {
  const uint32_t a0 = threadIdx.x, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0;
  float d[8][4] = {};
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  }
  const long long stop = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  float s = 0;
  for (int c = 0; c < 8; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <typename Kernel>
void report(const char* name, Kernel kernel, int threads, double instructions_per_block, double macs_per_instruction) {
  long long* cycles;
  float* sink;
  cudaMalloc(&cycles, 132 * sizeof(long long));
  cudaMalloc(&sink, 132 * 1024 * sizeof(float));
  kernel<<<132, threads>>>(cycles, sink);  // warm up
  kernel<<<132, threads>>>(cycles, sink);
  long long host[132];
  cudaMemcpy(host, cycles, sizeof(host), cudaMemcpyDeviceToHost);
  long long most = 0;
  for (long long c : host) most = c > most ? c : most;
  const double per = static_cast<double>(most) / instructions_per_block;
  std::printf("%-44s %4d threads: %7.2f SM cycles an instruction, %6.0f MAC/cycle/SM (%s)\n", name, threads, per,
              macs_per_instruction / per, cudaGetErrorString(cudaGetLastError()));
  cudaFree(cycles);
  cudaFree(sink);
}

}  // namespace

int main() {
  for (int groups : {1, 2, 4}) {
    const int t = 128 * groups;
    const double n = static_cast<double>(groups) * kIters * 8;
    report("wgmma m64n8k32 RS, 1 chain", wgmma_rate<8, 1>, t, n, 64.0 * 8 * 32);
    report("wgmma m64n16k32 RS, 1 chain", wgmma_rate<16, 1>, t, n, 64.0 * 16 * 32);
    report("wgmma m64n16k32 RS, 2 chains", wgmma_rate<16, 2>, t, n, 64.0 * 16 * 32);
    report("wgmma m64n32k32 RS, 1 chain", wgmma_rate<32, 1>, t, n, 64.0 * 32 * 32);
    report("wgmma m64n64k32 RS, 1 chain", wgmma_rate<64, 1>, t, n, 64.0 * 64 * 32);
  }
  for (int warps : {4, 8, 16}) {
    const double n = static_cast<double>(warps) * kIters * 8;
    report("mma.sync m16n8k16 f16, 8 chains a warp", mma_rate, 32 * warps, n, 16.0 * 8 * 16);
  }
  return 0;
}
