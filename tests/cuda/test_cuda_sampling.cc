// Sampling on the GPU against the host: greedy (argmax.h) against Ops::argmax, on random rows with
// planted ties (the lower index must win), -inf entries and a vocabulary that is no multiple of
// anything; Gumbel-max draws (sampling.h) against Ops::sample, token for token.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/counter_rng.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#include "cuda/sampling.h"
#include "gpu_test_util.h"

namespace nibble {
namespace {

using testing::poisoned;
using testing::random_f32;

TEST(CudaSampling, ArgmaxMatchesHost) {
  SKIP_WITHOUT_GPU();
  for (const int64_t vocab : {1, 7, 32000, 50257, 131072}) {
    const int64_t rows = 6;
    Tensor logits = random_f32({rows, vocab}, static_cast<uint32_t>(vocab));
    float* x = logits.data<float>();
    if (vocab > 1) {
      // Row 1: the largest value at two indices (the lower must win).
      x[1 * vocab + vocab - 1] = 100.0f;
      x[1 * vocab + vocab / 2] = 100.0f;
      // Row 2: every value equal (index 0 wins); row 3: -inf everywhere but one entry.
      for (int64_t i = 0; i < vocab; ++i) x[2 * vocab + i] = 0.5f;
      for (int64_t i = 0; i < vocab; ++i) x[3 * vocab + i] = -INFINITY;
      x[3 * vocab + vocab / 3] = -1e30f;
    }
    CpuOps cpu;
    Tensor want = Tensor::zeros(DType::kI32, {rows});
    cpu.argmax(logits, want);
    cuda::CudaOps gpu;
    Tensor got = poisoned(DType::kI32, {rows});
    gpu.argmax(gpu.upload(logits), got);
    const Tensor host = gpu.download(got);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(host.data<int32_t>()[r], want.data<int32_t>()[r]) << "vocab " << vocab << " row " << r;
    if (vocab > 1) {
      EXPECT_EQ(want.data<int32_t>()[1], vocab / 2);
      EXPECT_EQ(want.data<int32_t>()[2], 0);
      EXPECT_EQ(want.data<int32_t>()[3], vocab / 3);
    }
  }
}

// Temperatures 0 (argmax), tiny, usual and hot, with random keys: the kernel (called directly, whatever
// NIBBLE_DEVICE_SAMPLING says) picks the host's token in every row, over 8 draws a row.
TEST(CudaSampling, GumbelSampleMatchesHost) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> temps = {0.0f, 1e-3f, 0.3f, 0.7f, 1.0f, 2.0f};
  const auto rows = static_cast<int64_t>(temps.size());
  for (const int64_t vocab : {1, 7, 32000, 131072}) {
    Tensor logits = random_f32({rows, vocab}, static_cast<uint32_t>(vocab) + 1, 3.0f);
    if (vocab > 1) logits.data<float>()[2 * vocab + 1] = -INFINITY;
    Tensor temperatures = Tensor::zeros(DType::kF32, {rows});
    for (int64_t r = 0; r < rows; ++r) temperatures.data<float>()[r] = temps[static_cast<std::size_t>(r)];
    const Tensor d_logits = cuda::upload(logits), d_temperatures = cuda::upload(temperatures);
    CpuOps cpu;
    for (uint64_t draw = 0; draw < 8; ++draw) {
      Tensor keys = Tensor::zeros(DType::kI64, {rows});
      for (int64_t r = 0; r < rows; ++r)
        keys.data<int64_t>()[r] = static_cast<int64_t>(splitmix64(draw * 977 + static_cast<uint64_t>(r)));
      Tensor want = Tensor::zeros(DType::kI32, {rows});
      cpu.sample(logits, {.temperatures = temperatures, .keys = keys}, want);
      Tensor got = poisoned(DType::kI32, {rows});
      cuda::sample_rows(d_logits, d_temperatures, cuda::upload(keys), got, cuda::compute_stream());
      const Tensor host = cuda::download(got);
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(host.data<int32_t>()[r], want.data<int32_t>()[r])
            << "vocab " << vocab << " temperature " << temps[static_cast<std::size_t>(r)] << " draw " << draw;
    }
  }
}

}  // namespace
}  // namespace nibble
