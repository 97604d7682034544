// CPU attention: hand-derived two-key cases (plain and soft-capped), GQA head mapping, and
// independence from where the KV blocks sit (a shuffled block table gives the same output as an
// in-order one).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "cpu/cpu_ops.h"

namespace nibble {
namespace {

Tensor i32(std::vector<int32_t> v, Shape shape) {
  Tensor t = Tensor::zeros(DType::kI32, std::move(shape));
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

struct CacheSetup {
  AttentionParams params;
  int64_t block_size;
  int64_t num_blocks;
};

// Runs one sequence of `qkv` (T, width) through attention with the given block table.
Tensor run(const CacheSetup& s, const Tensor& qkv, const std::vector<int32_t>& blocks, KvCacheDType dtype) {
  CpuOps ops;
  const int64_t T = qkv.dim(0);
  const DType storage = kv_storage_dtype(dtype);
  KvCacheLayer cache{.k = ops.empty(storage, {s.num_blocks, s.block_size, s.params.num_kv_heads, s.params.head_dim}),
                     .v = ops.empty(storage, {s.num_blocks, s.block_size, s.params.num_kv_heads, s.params.head_dim})};
  std::vector<int32_t> positions(T), slots(T);
  std::iota(positions.begin(), positions.end(), 0);
  for (int64_t t = 0; t < T; ++t) slots[t] = static_cast<int32_t>(blocks[t / s.block_size] * s.block_size + t % s.block_size);
  ForwardBatch batch{.num_tokens = T, .num_seqs = 1, .token_ids = i32(std::vector<int32_t>(T), {T}),
                     .positions = i32(positions, {T}), .query_start = i32({0, static_cast<int32_t>(T)}, {2}),
                     .seq_lens = i32({static_cast<int32_t>(T)}, {1}),
                     .block_tables = i32(blocks, {1, static_cast<int64_t>(blocks.size())}),
                     .slot_mapping = i32(slots, {T}), .logit_rows = i32({0}, {1}), .max_query_len = T,
                     .max_seq_len = T};
  Tensor out = ops.empty(DType::kF32, {T, s.params.num_heads * s.params.head_dim});
  ops.attention(qkv, cache, dtype, batch, s.params, out);
  return out;
}

TEST(CpuAttention, TwoKeysByHand) {
  // One head, head_dim 2. Token 0: k = (1, 0), v = (1, 2). Token 1: q = (ln 3, 0), k = (1, 0)... scale 1.
  const CacheSetup s{.params = {.num_heads = 1, .num_kv_heads = 1, .head_dim = 2, .softmax_scale = 1.0f},
                .block_size = 4, .num_blocks = 1};
  Tensor qkv = Tensor::zeros(DType::kF32, {2, 6});
  const float rows[12] = {0, 0, /*k*/ 1, 0, /*v*/ 1, 2,
                          std::log(3.0f), 0, /*k*/ 0, 0, /*v*/ 5, 6};
  std::copy_n(rows, 12, qkv.data<float>());
  const Tensor out = run(s, qkv, {0}, KvCacheDType::kBf16);
  // Token 0 sees only itself.
  EXPECT_FLOAT_EQ(out.data<float>()[0], 1.0f);
  EXPECT_FLOAT_EQ(out.data<float>()[1], 2.0f);
  // Token 1: scores (ln 3, 0) -> weights (3/4, 1/4): v = 0.75 (1, 2) + 0.25 (5, 6) = (2, 3).
  EXPECT_NEAR(out.data<float>()[2], 2.0f, 1e-5);
  EXPECT_NEAR(out.data<float>()[3], 3.0f, 1e-5);
}

TEST(CpuAttention, SoftCapByHand) {
  // As TwoKeysByHand, with q scaled so that token 1's scores are (4, 0) · scale 0.5 = (2, 0), capped
  // at 1.5: (1.5 tanh(4/3), 0).
  const CacheSetup s{.params = {.num_heads = 1, .num_kv_heads = 1, .head_dim = 2, .softmax_scale = 0.5f,
                                .logit_softcap = 1.5f},
                     .block_size = 4, .num_blocks = 1};
  Tensor qkv = Tensor::zeros(DType::kF32, {2, 6});
  const float rows[12] = {0, 0, /*k*/ 1, 0, /*v*/ 1, 2,
                          4, 0, /*k*/ 0, 0, /*v*/ 5, 6};
  std::copy_n(rows, 12, qkv.data<float>());
  const Tensor out = run(s, qkv, {0}, KvCacheDType::kBf16);
  const double w0 = 1.0 / (1.0 + std::exp(-1.5 * std::tanh(4.0 / 3.0)));  // softmax of (c, 0)
  EXPECT_NEAR(out.data<float>()[2], w0 * 1 + (1 - w0) * 5, 1e-5);
  EXPECT_NEAR(out.data<float>()[3], w0 * 2 + (1 - w0) * 6, 1e-5);
}

TEST(CpuAttention, BlockPlacementDoesNotMatter) {
  const CacheSetup s{.params = {.num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .softmax_scale = 0.35f,
                           .k_scale = 0.5f, .v_scale = 0.25f},
                .block_size = 4, .num_blocks = 8};
  const int64_t T = 19, width = (4 + 2 * 2) * 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  Tensor qkv = Tensor::zeros(DType::kF32, {T, width});
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<float>()[i] = dist(rng);
  for (const KvCacheDType dtype : {KvCacheDType::kBf16, KvCacheDType::kFp8E4M3}) {
    const Tensor a = run(s, qkv, {0, 1, 2, 3, 4}, dtype);
    const Tensor b = run(s, qkv, {6, 2, 7, 0, 3}, dtype);
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]);
  }
}

TEST(CpuAttention, Fp8CacheFoldsScales) {
  // With values exactly representable after dividing by the scales, the FP8 cache gives the same
  // result as the BF16 cache.
  const CacheSetup s{.params = {.num_heads = 2, .num_kv_heads = 1, .head_dim = 4, .softmax_scale = 0.5f,
                           .k_scale = 0.5f, .v_scale = 2.0f},
                .block_size = 2, .num_blocks = 3};
  const int64_t T = 5, width = (2 + 2) * 4;
  Tensor qkv = Tensor::zeros(DType::kF32, {T, width});
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data<float>()[i] = static_cast<float>((i * 7) % 9 - 4) * 0.5f;
  const Tensor a = run(s, qkv, {0, 1, 2}, KvCacheDType::kBf16);
  const Tensor b = run(s, qkv, {0, 1, 2}, KvCacheDType::kFp8E4M3);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 1e-5);
}

}  // namespace
}  // namespace nibble
