// Shared by the bench/probe_*_rate.cu measurement tools: a kernel that times its own loop with
// clock64 and keeps its sums live, launched over a whole number of blocks an SM.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace nibble::probe {

// The block's loop span (from `start`) into cycles[block], and its sums into sink, so that the
// compiler keeps the loop's work.
template <int M>
__device__ inline void finish_block(long long start, const float (&acc)[M], long long* cycles, float* sink) {
  const long long stop = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  float s = 0;
#pragma unroll
  for (int j = 0; j < M; ++j) s += acc[j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

// A stage's A fragments anew (four K blocks, two K steps, four registers), the INT4 nibble masks of
// moe_gemm_w4a8.cu applied to a word that changes every call.
__device__ inline void next_a_fragments(uint32_t& word, uint32_t (&a)[4][2][4]) {
  word = word * 1664525u + 1013904223u;
#pragma unroll
  for (int b = 0; b < 4; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) a[b][h][i] = ((word ^ (b * 8 + h * 4 + i)) >> (4 * (i & 1))) & 0x0F0F0F0Fu;
}

struct BlockTiming {
  long long most_cycles = 0;  // the slowest block's loop, SM clock cycles
  float ms = 0;               // the timed launch, CUDA events
};

// kernel(args..., cycles, sink) over blocks_per_sm blocks an SM, once to warm up and once timed.
template <typename... Params, typename... Args>
BlockTiming time_blocks(void (*kernel)(Params...), int blocks_per_sm, int threads, int smem, Args... args) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int blocks = sms * blocks_per_sm;
  long long* cycles;
  float* sink;
  cudaMalloc(&cycles, blocks * sizeof(long long));
  cudaMalloc(&sink, static_cast<size_t>(blocks) * threads * sizeof(float));
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  kernel<<<blocks, threads, smem>>>(args..., cycles, sink);
  cudaEventRecord(begin);
  kernel<<<blocks, threads, smem>>>(args..., cycles, sink);
  cudaEventRecord(end);
  cudaEventSynchronize(end);
  BlockTiming t;
  cudaEventElapsedTime(&t.ms, begin, end);
  std::vector<long long> host(blocks);
  cudaMemcpy(host.data(), cycles, blocks * sizeof(long long), cudaMemcpyDeviceToHost);
  for (const long long c : host) t.most_cycles = c > t.most_cycles ? c : t.most_cycles;
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaFree(cycles);
  cudaFree(sink);
  return t;
}

}  // namespace nibble::probe
