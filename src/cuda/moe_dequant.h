// Expert weights from the grouped GEMM's repacked layouts (moe_gemm_w4a8.h) back to plain row-major
// FP8 e4m3, for the prefill path's cuBLASLt GEMMs. INT4 values v in [-8, 7] are exact in e4m3, so
// the conversion is exact; the per-row weight scales stay separate. Not a load-time operation: it
// runs inside the MoE layer, on a bounded scratch, for the experts a call needs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/moe_gemm_w4a8.h"

namespace nibble::cuda {

struct DequantArgs {
  ExpertWeightFormat format;
  const void* weights;  // repacked (E, N·K/2) INT4 or (E, N·K) FP8: all experts of the layer
  uint8_t* out;         // FP8 e4m3 (count, N, K) row-major: expert first + i at out[i]
  int64_t first;        // first expert id
  int64_t count;        // consecutive experts first .. first + count - 1
  int64_t n;            // N, a multiple of 16
  int64_t k;            // K, a multiple of 64
};

void dequantize_experts_fp8(const DequantArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
