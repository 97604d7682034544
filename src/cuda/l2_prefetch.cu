// Bulk L2 prefetches from a small kernel (l2_prefetch.h).
#include "cuda/l2_prefetch.h"

#include <algorithm>

#include "cuda/cuda_check.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int64_t kChunkBytes = 64 * 1024;  // one prefetch instruction's bytes
constexpr int kThreads = 32;
constexpr int64_t kMaxBlocks = 64;

__global__ void __launch_bounds__(kThreads) prefetch_l2_kernel(const uint8_t* p, int64_t bytes) {
  ptx::launch_dependents();
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  for (int64_t c = blockIdx.x * int64_t{kThreads} + threadIdx.x; c < chunks; c += int64_t{gridDim.x} * kThreads) {
    const int64_t at = c * kChunkBytes;
    ptx::prefetch_l2_bulk(p + at, static_cast<uint32_t>(min(kChunkBytes, bytes - at)));
  }
  ptx::grid_dependency_wait();  // complete only after the kernel before: the chain stays ordered
}

}  // namespace

void prefetch_l2(const void* p, int64_t bytes, cudaStream_t stream) {
  check(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "prefetch_l2: the address is not 16-byte aligned");
  bytes = bytes / 16 * 16;
  if (bytes <= 0) return;
  const int64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((chunks + kThreads - 1) / kThreads, 1, kMaxBlocks));
  launch_kernel(prefetch_l2_kernel, blocks, kThreads, 0, stream, static_cast<const uint8_t*>(p), bytes);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
