// Random fill kernels: splitmix64 of (seed, index) -> a 24-bit uniform in [0, 1) -> the target
// type.
#include "random_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "cuda/cuda_check.h"

namespace nibble::bench {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 132 * 32;  // a grid-stride loop covers the rest

__device__ float uniform01(uint64_t seed, std::size_t i) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(i) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

enum class FillKind { kBf16, kFp8, kF32 };

template <FillKind kKind>
__global__ void fill_kernel(void* out, std::size_t n, float lo, float hi, uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = lo + (hi - lo) * uniform01(seed, i);
    if constexpr (kKind == FillKind::kBf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16(v);
    } else if constexpr (kKind == FillKind::kFp8) {
      static_cast<__nv_fp8_storage_t*>(out)[i] =
          __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

template <FillKind kKind>
void launch_fill(void* out, std::size_t n, float lo, float hi, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  fill_kernel<kKind><<<blocks, kThreads, 0, stream>>>(out, n, lo, hi, seed);
  cuda_check(cudaGetLastError());
}

}  // namespace

void fill_uniform_bf16(void* out, std::size_t n, float amplitude, uint64_t seed,
                       cudaStream_t stream) {
  launch_fill<FillKind::kBf16>(out, n, -amplitude, amplitude, seed, stream);
}

void fill_uniform_fp8(void* out, std::size_t n, float amplitude, uint64_t seed,
                      cudaStream_t stream) {
  launch_fill<FillKind::kFp8>(out, n, -amplitude, amplitude, seed, stream);
}

void fill_uniform_f32(float* out, std::size_t n, float lo, float hi, uint64_t seed,
                      cudaStream_t stream) {
  launch_fill<FillKind::kF32>(out, n, lo, hi, seed, stream);
}

}  // namespace nibble::bench
