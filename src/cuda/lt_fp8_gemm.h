// One cuBLASLt FP8 e4m3 GEMM shape, planned once (descriptors and the heuristic's candidates):
//   D (n, m) row-major = alpha · B (n, k) · A (m, k)ᵀ, fp32 accumulation, D in BF16 or F32.
// In cuBLASLt's column-major terms that is D (m×n) = op(A)·B with A stored k×m and transposed: the
// "TN" layout FP8 requires. A is the weight (out_features m, in_features k) row-major, B the
// activations (tokens n, k) row-major. m and k must be multiples of 16.
// A per-tensor scale travels as the host scalar alpha, not as CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: with
// a scale pointer set after planning, cublasLtMatmul answered CUBLAS_STATUS_NOT_SUPPORTED on an H200
// with CUDA 13.0 (2026-11-29). For the same reason run() moves on to the heuristic's next candidate
// when one is refused (decided on the first call, which must not be inside a graph capture).
// Scales::kOuterVectors plans the GEMM with cuBLASLt's outer-vector scaling, planned with the modes
// and scale pointers set (the heuristic refuses the modes without pointers; run_scaled() sets each
// call's): D[i][j] = a_scale[i] · b_scale[j] · (A·B)[i][j] (a_scale: m weight rows, b_scale: n
// tokens), so no scaling pass follows. Where cuBLASLt offers no such algorithm, usable() is false (then and after
// a run() that every candidate refused) and the caller scales the product itself.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <vector>

#include "core/dtype.h"

namespace nibble::cuda {

void cublas_check(cublasStatus_t status, std::source_location where = std::source_location::current());

class LtFp8Gemm {
 public:
  enum class Scales { kAlpha, kOuterVectors };

  LtFp8Gemm(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, std::size_t workspace_bytes,
            DType out = DType::kBF16, Scales scales = Scales::kAlpha, const float* a_scale = nullptr,
            const float* b_scale = nullptr);
  ~LtFp8Gemm();
  LtFp8Gemm(const LtFp8Gemm&) = delete;
  LtFp8Gemm& operator=(const LtFp8Gemm&) = delete;

  void run(const void* a, const void* b, void* d, float alpha, void* workspace, cudaStream_t stream);
  // Scales::kOuterVectors: D = a_scale ⊗ b_scale · (A·B). False (nothing launched) where every
  // candidate refused.
  bool run_scaled(const void* a, const void* b, void* d, const float* a_scale, const float* b_scale,
                  void* workspace, cudaStream_t stream);
  bool usable() const { return current_ < algos_.size(); }

 private:
  void set_scale_pointers(const float* a_scale, const float* b_scale);

  cublasLtHandle_t handle_;
  std::size_t workspace_bytes_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr;
  cublasLtMatrixLayout_t b_layout_ = nullptr;
  cublasLtMatrixLayout_t d_layout_ = nullptr;
  Scales scales_;
  std::vector<cublasLtMatmulAlgo_t> algos_;  // the heuristic's candidates, best first
  std::size_t current_ = 0;                  // the first that cublasLtMatmul accepted (size: none)
};

}  // namespace nibble::cuda
