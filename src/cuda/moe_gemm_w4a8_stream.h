// The register-streaming variant of the decode MoE GEMM (GemmMath::kStream, moe_gemm_w4a8.h): no
// shared memory and no barriers; each warp owns units of (active expert, 64 output channels, K split)
// and streams their INT4 weights and FP8 activation rows from global memory into registers a few
// 64-wide K blocks ahead of its mma.sync math (the f16 forms of moe_gemm_w4a8.cu's mma.sync path).
// Tiles of up to 16 rows, INT4 weights only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/moe_gemm_w4a8.h"

namespace nibble::cuda {

// Warps an SM runs at once with tiles of `token_tiles` 8-row tiles (registers): what choose_k_splits
// sizes the units for.
constexpr int stream_warps_per_sm(int token_tiles) { return token_tiles == 1 ? 16 : 12; }

// token_tiles: 1 or 2 (8 or 16 rows a chunk).
void launch_moe_gemm_stream(const GemmW4A8Args& p, int token_tiles, cudaStream_t stream);

}  // namespace nibble::cuda
