// Owned CUDA stream and cuBLAS / cuBLASLt handles for the benchmark harness (the status check is
// cuda::cublas_check, from src/cuda/lt_fp8_gemm.h).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <source_location>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/lt_fp8_gemm.h"

namespace nibble::bench {

using cuda::cublas_check;

class Stream {
 public:
  Stream() { cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class BlasHandle {
 public:
  BlasHandle() { cublas_check(cublasCreate(&handle_)); }
  ~BlasHandle() { (void)cublasDestroy(handle_); }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

class LtHandle {
 public:
  LtHandle() { cublas_check(cublasLtCreate(&handle_)); }
  ~LtHandle() { (void)cublasLtDestroy(handle_); }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace nibble::bench
