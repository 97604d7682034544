// The two producers of grouped-GEMM inputs: per-token FP8 quantization of the layer input, and
// SiLU/GELU(gate) · up of the gate_up output followed by the same quantization. Each writes FP8 codes,
// per-row scales and per-64 sums of the FP8 values.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/ops.h"

namespace nibble::cuda {

struct QuantizeRowsArgs {
  const void* x;     // BF16 (rows, cols)
  uint8_t* codes;    // FP8 (rows, cols)
  float* scale;      // (rows)
  float* sums;       // (rows, cols / 64)
  int64_t rows;
  int64_t cols;
  float static_scale = 0.0f;  // > 0: this per-tensor scale (values beyond ±448·scale saturate)
};

void quantize_rows_fp8(const QuantizeRowsArgs& args, cudaStream_t stream);

struct ActivationArgs {
  const float* gate_up;  // (splits, max_rows, 2I): partial sums over K splits, added here
  int64_t splits;
  int64_t max_rows;
  uint8_t* codes;        // FP8 (rows, I)
  float* scale;          // (rows)
  float* sums;           // (rows, I / 64)
  int64_t rows;
  int64_t intermediate;  // I
  Activation activation;
};

void activation_quantize_fp8(const ActivationArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
