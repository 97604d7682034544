// Helpers shared by the GPU tests: skipping without a GPU, random tensors, poisoning, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "core/bf16.h"
#include "core/tensor.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"

namespace nibble::testing {

#define SKIP_WITHOUT_GPU() \
  if (::nibble::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

// Milliseconds the GPU takes for the work `queue` puts on `stream`, timed by CUDA events around it.
inline float gpu_milliseconds(cudaStream_t stream, const std::function<void()>& queue) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cuda_check(cudaEventCreate(&start));
  cuda_check(cudaEventCreate(&stop));
  cuda_check(cudaEventRecord(start, stream));
  queue();
  cuda_check(cudaEventRecord(stop, stream));
  cuda_check(cudaEventSynchronize(stop));
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, start, stop));
  cuda_check(cudaEventDestroy(start));
  cuda_check(cudaEventDestroy(stop));
  return ms;
}

inline Tensor random_f32(Shape shape, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  Tensor t = Tensor::zeros(DType::kF32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

inline Tensor to_bf16(const Tensor& f32) {
  Tensor t = Tensor::zeros(DType::kBF16, f32.shape());
  for (int64_t i = 0; i < t.numel(); ++i) t.data<Bf16>()[i] = float_to_bf16(f32.data<float>()[i]);
  return t;
}

// A device tensor filled with 0xFF bytes: NaN in every float format, so an unwritten element shows.
inline Tensor poisoned(DType dtype, Shape shape) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  std::memset(t.raw(), 0xFF, t.nbytes());
  return cuda::upload(t);
}

// Relative L2 distance; NaN anywhere in `got` gives infinity.
inline double rel_l2(const float* ref, const float* got, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double{ref[i]} - got[i]) * (double{ref[i]} - got[i]);
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace nibble::testing
