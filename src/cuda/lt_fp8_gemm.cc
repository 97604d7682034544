// cuBLASLt FP8 GEMM plan: descriptors and algorithm chosen once per shape.
#include "cuda/lt_fp8_gemm.h"

#include <array>

#include "core/error.h"

namespace nibble::cuda {
namespace {

constexpr int kCandidates = 8;

}  // namespace

void cublas_check(cublasStatus_t status, std::source_location where) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuBLAS error ", cublasGetStatusName(status), " (", cublasGetStatusString(status), ") at ",
         where.file_name(), ":", where.line());
}

LtFp8Gemm::LtFp8Gemm(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k,
                     std::size_t workspace_bytes, DType out, Scales scales, const float* a_scale,
                     const float* b_scale)
    : handle_(handle), workspace_bytes_(workspace_bytes), scales_(scales) {
  check(k % 16 == 0 && m % 16 == 0, "FP8 GEMM ", m, "x", n, "x", k,
        ": m and k must be multiples of 16");
  cublas_check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t no_transpose = CUBLAS_OP_N;
  cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                              sizeof(transpose)));
  cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose,
                                              sizeof(no_transpose)));
  if (scales_ == Scales::kOuterVectors) {
    const cublasLtMatmulMatrixScale_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)));
    cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)));
    check(a_scale != nullptr && b_scale != nullptr, "LtFp8Gemm: outer-vector scales need scale pointers to plan");
    set_scale_pointers(a_scale, b_scale);
  }
  const auto um = static_cast<uint64_t>(m);
  const auto un = static_cast<uint64_t>(n);
  const auto uk = static_cast<uint64_t>(k);
  cublas_check(cublasLtMatrixLayoutCreate(&a_layout_, CUDA_R_8F_E4M3, uk, um, k));
  cublas_check(cublasLtMatrixLayoutCreate(&b_layout_, CUDA_R_8F_E4M3, uk, un, k));
  check(out == DType::kBF16 || out == DType::kF32, "FP8 GEMM: output must be BF16 or F32");
  cublas_check(cublasLtMatrixLayoutCreate(&d_layout_, out == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF, um, un, m));

  cublasLtMatmulPreference_t preference = nullptr;
  cublas_check(cublasLtMatmulPreferenceCreate(&preference));
  cublas_check(cublasLtMatmulPreferenceSetAttribute(preference,
                                                    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes_, sizeof(workspace_bytes_)));
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_layout_, b_layout_, d_layout_, d_layout_,
                                     preference, kCandidates, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (scales_ == Scales::kOuterVectors && (status != CUBLAS_STATUS_SUCCESS || found == 0)) return;  // not usable
  cublas_check(status);
  check(found > 0, "cuBLASLt has no FP8 algorithm for ", m, "x", n, "x", k);
  for (int i = 0; i < found; ++i) algos_.push_back(results[i].algo);
}

LtFp8Gemm::~LtFp8Gemm() {
  if (d_layout_ != nullptr) cublasLtMatrixLayoutDestroy(d_layout_);
  if (b_layout_ != nullptr) cublasLtMatrixLayoutDestroy(b_layout_);
  if (a_layout_ != nullptr) cublasLtMatrixLayoutDestroy(a_layout_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

void LtFp8Gemm::set_scale_pointers(const float* a_scale, const float* b_scale) {
  cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
  cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
}

bool LtFp8Gemm::run_scaled(const void* a, const void* b, void* d, const float* a_scale, const float* b_scale,
                           void* workspace, cudaStream_t stream) {
  check(scales_ == Scales::kOuterVectors, "LtFp8Gemm::run_scaled: planned without scale vectors");
  set_scale_pointers(a_scale, b_scale);
  const float alpha = 1.0f, beta = 0.0f;
  for (; current_ < algos_.size(); ++current_) {
    const cublasStatus_t status =
        cublasLtMatmul(handle_, desc_, &alpha, a, a_layout_, b, b_layout_, &beta, d, d_layout_, d, d_layout_,
                       &algos_[current_], workspace, workspace_bytes_, stream);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) continue;
    cublas_check(status);
    return true;
  }
  return false;
}

void LtFp8Gemm::run(const void* a, const void* b, void* d, float alpha, void* workspace,
                    cudaStream_t stream) {
  const float beta = 0.0f;
  for (;;) {
    const cublasStatus_t status =
        cublasLtMatmul(handle_, desc_, &alpha, a, a_layout_, b, b_layout_, &beta, d, d_layout_, d,
                       d_layout_, &algos_[current_], workspace, workspace_bytes_, stream);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED && current_ + 1 < algos_.size()) {
      ++current_;
      continue;
    }
    cublas_check(status);
    return;
  }
}

}  // namespace nibble::cuda
