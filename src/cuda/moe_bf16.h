// The MoE layer with BF16 experts (`--quantization none`, the unquantized comparison point): routing
// as in moe_route.h, then every expert runs over all T tokens with cuBLAS (rows it was not chosen for
// get weight 0 in the combine), so the launch sequence is fixed and a CUDA graph can capture it.
// Decode reads each weight once, as any bf16 engine must; prefill spends E/top_k times the FLOPs of
// a grouped GEMM, which is acceptable for a comparison path and keeps it short.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "core/tensor.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble::cuda {

// Scratch for up to max_tokens tokens; grows, keeping superseded buffers (graphs may read them).
struct MoeBf16Workspace {
  int64_t max_tokens = 0;
  Tensor router_logits;  // F32 (T, E)
  Tensor topk_ids;       // I32 (T, K)
  Tensor topk_weights;   // F32 (T, K)
  Tensor gate_up;        // F32 (T, 2I)
  Tensor act;            // BF16 (T, I)
  Tensor down;           // F32 (T, H)
  Tensor sum;            // F32 (T, H); unused when the output is F32 (the sums go there)
  std::vector<Tensor> retired;
};

// out (T, H) = MoE(x (T, H) BF16) for w.experts in kBf16: BF16, or F32 (a tensor-parallel rank's
// partial sum, rounded after the all-reduce).
void moe_bf16(const Tensor& x, const MoeWeights& w, const MoeParams& params, MoeBf16Workspace& ws, Tensor& out,
              cublasHandle_t handle, cudaStream_t stream);

}  // namespace nibble::cuda
