// Greedy sampling on the GPU (argmax.h) against the host's Ops::argmax, on random rows with planted
// ties (the lower index must win), -inf entries and a vocabulary that is no multiple of anything.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
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

}  // namespace
}  // namespace nibble
