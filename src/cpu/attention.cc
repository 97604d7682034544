// CpuOps: rotary embedding, KV-cache write and causal paged attention (GQA, BF16 or FP8 cache,
// optional logit soft-cap).
#include <cmath>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/cpu_ops.h"

namespace nibble {
namespace {

void store(const KvCacheDType dtype, float value, float scale, void* base, int64_t index) {
  if (dtype == KvCacheDType::kFp8E4M3)
    static_cast<uint8_t*>(base)[index] = float_to_fp8_e4m3(value / scale);
  else
    static_cast<Bf16*>(base)[index] = float_to_bf16(value);
}

float load(const KvCacheDType dtype, const void* base, int64_t index) {
  return dtype == KvCacheDType::kFp8E4M3 ? fp8_e4m3_to_float(static_cast<const uint8_t*>(base)[index])
                                         : bf16_to_float(static_cast<const Bf16*>(base)[index]);
}

}  // namespace

void CpuOps::rope(Tensor& qkv, const Tensor& positions, const AttentionParams& p, double theta) {
  const int64_t D = p.head_dim, half = D / 2;
  const int64_t width = (p.num_heads + 2 * p.num_kv_heads) * D;
  expect(qkv, DType::kF32, {-1, width}, "rope qkv");
  // Same recipe as the reference implementation: inverse frequencies and angles in fp32.
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / D));
  for (int64_t t = 0; t < qkv.dim(0); ++t) {
    const auto pos = static_cast<float>(positions.data<int32_t>()[t]);
    float* row = qkv.data<float>() + t * width;
    for (int64_t head = 0; head < p.num_heads + p.num_kv_heads; ++head) {  // q heads then k heads
      float* x = row + head * D;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        const float c = std::cos(angle), s = std::sin(angle);
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void CpuOps::attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                       const ForwardBatch& batch, const AttentionParams& p, Tensor& out) {
  const int64_t D = p.head_dim, Hq = p.num_heads, Hkv = p.num_kv_heads;
  const int64_t width = (Hq + 2 * Hkv) * D, kv_width = Hkv * D;
  const int64_t block_size = cache.k.dim(1);
  const int64_t max_blocks = batch.block_tables.dim(1);
  expect(qkv, DType::kF32, {batch.num_tokens, width}, "attention qkv");
  expect(out, DType::kF32, {batch.num_tokens, Hq * D}, "attention output");

  // 1. Append the new keys and values.
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int64_t slot = batch.slot_mapping.data<int32_t>()[t];
    const float* row = qkv.data<float>() + t * width;
    for (int64_t i = 0; i < kv_width; ++i) {
      store(cache_dtype, row[Hq * D + i], p.k_scale, cache.k.raw(), slot * kv_width + i);
      store(cache_dtype, row[Hq * D + kv_width + i], p.v_scale, cache.v.raw(), slot * kv_width + i);
    }
  }
  // 2. Each query attends to keys 0..its position of its own sequence.
  const bool fp8 = cache_dtype == KvCacheDType::kFp8E4M3;
  const float k_scale = fp8 ? p.k_scale : 1.0f, v_scale = fp8 ? p.v_scale : 1.0f;
  std::vector<float> scores;
  for (int64_t s = 0; s < batch.num_seqs; ++s) {
    const int32_t* blocks = batch.block_tables.data<int32_t>() + s * max_blocks;
    for (int64_t t = batch.query_start.data<int32_t>()[s]; t < batch.query_start.data<int32_t>()[s + 1]; ++t) {
      const int64_t context = batch.positions.data<int32_t>()[t] + 1;
      scores.resize(context);
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t kv_head = h / (Hq / Hkv);
        const float* q = qkv.data<float>() + t * width + h * D;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < context; ++j) {
          const int64_t slot = blocks[j / block_size] * block_size + j % block_size;
          const int64_t base = slot * kv_width + kv_head * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * load(cache_dtype, cache.k.raw(), base + d);
          scores[j] = dot * k_scale * p.softmax_scale;
          if (p.logit_softcap > 0.0f) scores[j] = p.logit_softcap * std::tanh(scores[j] / p.logit_softcap);
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < context; ++j) sum += scores[j] = std::exp(scores[j] - max_score);
        float* o = out.data<float>() + t * Hq * D + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
        for (int64_t j = 0; j < context; ++j) {
          const int64_t slot = blocks[j / block_size] * block_size + j % block_size;
          const int64_t base = slot * kv_width + kv_head * D;
          const float weight = scores[j] / sum;
          for (int64_t d = 0; d < D; ++d) o[d] += weight * load(cache_dtype, cache.v.raw(), base + d);
        }
        for (int64_t d = 0; d < D; ++d) o[d] *= v_scale;
      }
    }
  }
}

}  // namespace nibble
