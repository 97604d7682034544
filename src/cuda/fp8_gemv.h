// The FP8 linear of a few tokens (decode at small batches) in one kernel: the per-token quantization
// of x, the products with the FP8 weights on the CUDA cores (every product of two FP8 values is
// exact in fp32; the sums are fp32's) and the scales, where the general path takes three launches
// (quantize_rows, cuBLASLt, the scaling pass). Bound by the weights' bytes, which the kernel starts
// loading before its grid dependency wait (they are constant; launch.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

inline constexpr int64_t kFp8GemvMaxTokens = 4;

struct Fp8GemvArgs {
  const void* x;         // BF16 (tokens, k)
  const uint8_t* w;      // FP8 e4m3 (n, k), rows 16-byte aligned
  const float* w_scale;  // (n)
  void* out;             // (tokens, n) BF16, or F32 when out_f32
  bool out_f32 = false;
  int64_t tokens = 0;    // 1 .. kFp8GemvMaxTokens
  int64_t n = 0;
  int64_t k = 0;         // a multiple of 16
  // The input's FP8 scale: static_scale when > 0; else max(amax, 1e-12) / 448 of each row, its amax
  // over x's row or, row-parallel under tensor parallelism, amax_in[t] (reduced over the ranks).
  float static_scale = 0.0f;
  const float* amax_in = nullptr;  // (tokens)
  int rows_per_warp = 0;  // output channels a warp takes, 2 or 4; 0: NIBBLE_GEMV_ROWS, else the default
};

// Whether the kernel takes these sizes (tokens, and K whose quantized rows fit shared memory).
bool fp8_gemv_supported(int64_t tokens, int64_t k);

void fp8_gemv(const Fp8GemvArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
