// Sampling on the GPU against the host: greedy (argmax.h) against Ops::argmax, on random rows with
// planted ties (the lower index must win), -inf entries and a vocabulary that is no multiple of
// anything; Gumbel-max draws (sampling.h) against Ops::sample, token for token, with top-k and top-p
// filtering too.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
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

// Row r of a (rows, vocab) batch with the pattern r % 10: plain normal logits (scale 3); quantized to halves
// (ties at every cut); the largest value planted at a tenth of the tokens; NaN and -inf sprinkled (index 0
// included); one +inf; zeros of both signs; -inf but for a few tokens; NaN only; -inf only; equal but for
// a few.
Tensor filtered_rows(int64_t rows, int64_t vocab, uint32_t seed) {
  Tensor logits = random_f32({rows, vocab}, seed, 3.0f);
  std::mt19937 rng(seed);
  const auto pick = [&] { return static_cast<int64_t>(rng() % static_cast<uint32_t>(vocab)); };
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits.data<float>() + r * vocab;
    switch (r % 10) {
      case 0:
        break;
      case 1:
        for (int64_t i = 0; i < vocab; ++i) x[i] = std::round(x[i] * 2.0f) / 2.0f;
        break;
      case 2:
        for (int64_t i = 0; i < vocab; i += 10) x[i + r % std::min<int64_t>(10, vocab - i)] = 12.0f;
        break;
      case 3:
        for (int64_t i = 0; i < vocab; ++i)
          if (rng() % 8 == 0) x[i] = rng() % 2 == 0 ? NAN : -INFINITY;
        x[0] = NAN;
        break;
      case 4:
        x[pick()] = INFINITY;
        break;
      case 5:
        for (int64_t i = 0; i < vocab; ++i) x[i] = rng() % 2 == 0 ? 0.0f : -0.0f;
        break;
      case 6:
        for (int64_t i = 0; i < vocab; ++i) x[i] = -INFINITY;
        for (int j = 0; j < 3; ++j) x[pick()] = static_cast<float>(j);
        break;
      case 7:
        for (int64_t i = 0; i < vocab; ++i) x[i] = NAN;
        break;
      case 8:
        for (int64_t i = 0; i < vocab; ++i) x[i] = -INFINITY;
        break;
      case 9:
        for (int64_t i = 0; i < vocab; ++i) x[i] = 1.5f;
        for (int j = 0; j < 4; ++j) x[pick()] = 1.5f + static_cast<float>(j % 2 == 0 ? 1 : -1);
        break;
    }
  }
  return logits;
}

// Top-k and top-p (sampling_filtered.cu) against Ops::sample on the host, token for token: the rows of
// filtered_rows under mixed settings in one batch (temperature 0 too, k 1, k past the vocabulary, top_p
// from 1e-4 to 1, rows without a limit), top_k or top_p alone, over many keys; then once through
// CudaOps::sample.
TEST(CudaSampling, FilteredSampleMatchesHost) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> temps = {0.0f, 0.3f, 1.0f, 2.0f};
  const std::vector<float> top_ps = {1.0f, 0.0001f, 0.5f, 0.9f, 0.999999f};
  const int64_t rows = 40;
  for (const int64_t vocab : {1, 7, 1000, 32000, 151936}) {
    const std::vector<int64_t> top_ks = {0, 1, 2, 5, 50, vocab - 1, vocab, vocab + 5, 1 << 30};
    const Tensor logits = filtered_rows(rows, vocab, static_cast<uint32_t>(vocab) + 7);
    const Tensor d_logits = cuda::upload(logits);
    CpuOps cpu;
    for (uint64_t draw = 0; draw < 12; ++draw) {
      Tensor temperatures = Tensor::zeros(DType::kF32, {rows}), keys = Tensor::zeros(DType::kI64, {rows});
      Tensor top_k = Tensor::zeros(DType::kI32, {rows}), top_p = Tensor::zeros(DType::kF32, {rows});
      for (int64_t r = 0; r < rows; ++r) {
        const auto at = static_cast<std::size_t>(r) + draw;
        temperatures.data<float>()[r] = temps[at % temps.size()];
        top_k.data<int32_t>()[r] = static_cast<int32_t>(top_ks[(at / 2 + draw) % top_ks.size()]);
        top_p.data<float>()[r] = top_ps[(at / 3 + 2 * draw) % top_ps.size()];
        keys.data<int64_t>()[r] = static_cast<int64_t>(splitmix64(draw * 7919 + static_cast<uint64_t>(r)));
      }
      // Both limits, top_k alone, top_p alone.
      const bool with_k = draw % 3 != 2, with_p = draw % 3 != 1;
      Tensor want = Tensor::zeros(DType::kI32, {rows});
      cpu.sample(logits,
                 {.temperatures = temperatures,
                  .keys = keys,
                  .top_k = with_k ? top_k : Tensor(),
                  .top_p = with_p ? top_p : Tensor()},
                 want);
      const Tensor d_top_k = cuda::upload(top_k), d_top_p = cuda::upload(top_p);
      Tensor got = poisoned(DType::kI32, {rows});
      cuda::sample_filtered_rows(d_logits, cuda::upload(temperatures), cuda::upload(keys), with_k ? &d_top_k : nullptr,
                                 with_p ? &d_top_p : nullptr, got, cuda::compute_stream());
      const Tensor host = cuda::download(got);
      for (int64_t r = 0; r < rows; ++r)
        EXPECT_EQ(host.data<int32_t>()[r], want.data<int32_t>()[r])
            << "vocab " << vocab << " row " << r << " draw " << draw << " temperature " << temperatures.data<float>()[r]
            << " top_k " << (with_k ? top_k.data<int32_t>()[r] : 0) << " top_p "
            << (with_p ? top_p.data<float>()[r] : 1.0f);
      if (draw == 0) {  // through the backend (unless NIBBLE_DEVICE_SAMPLING=0, then on the host)
        cuda::CudaOps gpu;
        Tensor via_ops = poisoned(DType::kI32, {rows});
        gpu.sample(
            d_logits,
            {.temperatures = gpu.upload(temperatures), .keys = gpu.upload(keys), .top_k = d_top_k, .top_p = d_top_p},
            via_ops);
        const Tensor back = gpu.download(via_ops);
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_EQ(back.data<int32_t>()[r], want.data<int32_t>()[r]) << "CudaOps vocab " << vocab << " row " << r;
      }
    }
  }
}

// Penalties (logit_penalties.h) on random rows: each row a random set of distinct seen tokens with
// random counts (0: prompt only, kNotSeen, kBanned: -inf), biases on a third, and its own repetition,
// frequency and presence (row 2 none at all), against Ops::penalize on the host, bit for bit, every logit of every row compared.
TEST(CudaSampling, PenalizeMatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  for (const int64_t vocab : {7, 32000, 151936}) {
    const int64_t rows = 5;
    Tensor logits = random_f32({rows, vocab}, static_cast<uint32_t>(vocab) + 1, 4.0f);
    Tensor penalties = Tensor::zeros(DType::kF32, {rows, 3});
    std::vector<int32_t> offsets{0}, tokens, generated;
    std::vector<float> bias;
    std::uniform_real_distribution<float> rep(0.5f, 2.0f), adj(-2.0f, 2.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float* p = penalties.data<float>() + r * 3;
      p[0] = rep(rng), p[1] = adj(rng), p[2] = adj(rng);
      if (r != 2) {
        std::vector<int32_t> ids(static_cast<std::size_t>(vocab));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), rng);
        const std::size_t n = std::min<std::size_t>(ids.size(), 1 + rng() % 700);
        for (std::size_t i = 0; i < n; ++i) {  // kNotSeen and kBanned too; a bias on every third
          tokens.push_back(ids[i]), generated.push_back(static_cast<int32_t>(rng() % 6) - 2);
          bias.push_back(i % 3 == 0 ? 50.0f * adj(rng) : 0.0f);
        }
      }
      offsets.push_back(static_cast<int32_t>(tokens.size()));
    }
    auto i32 = [](const std::vector<int32_t>& v) {
      Tensor t = Tensor::zeros(DType::kI32, {static_cast<int64_t>(v.size())});
      std::copy(v.begin(), v.end(), t.data<int32_t>());
      return t;
    };
    Tensor host_bias = Tensor::zeros(DType::kF32, {static_cast<int64_t>(bias.size())});
    std::copy(bias.begin(), bias.end(), host_bias.data<float>());
    const PenaltySettings host{.row_offsets = i32(offsets), .tokens = i32(tokens), .generated = i32(generated),
                               .bias = host_bias, .penalties = penalties};
    Tensor want = Tensor::zeros(DType::kF32, {rows, vocab});
    std::copy_n(logits.data<float>(), rows * vocab, want.data<float>());
    CpuOps cpu;
    cpu.penalize(want, host);
    cuda::CudaOps gpu;
    Tensor got = gpu.upload(logits);
    gpu.penalize(got, {.row_offsets = gpu.upload(host.row_offsets), .tokens = gpu.upload(host.tokens),
                       .generated = gpu.upload(host.generated), .bias = gpu.upload(host_bias),
                       .penalties = gpu.upload(penalties)});
    const Tensor back = gpu.download(got);
    int64_t changed = 0;
    for (int64_t i = 0; i < rows * vocab; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(back.data<float>()[i]), std::bit_cast<uint32_t>(want.data<float>()[i]))
          << "vocab " << vocab << " element " << i;
      changed += want.data<float>()[i] != logits.data<float>()[i];
    }
    EXPECT_GT(changed, 0);
  }
}

}  // namespace
}  // namespace nibble
