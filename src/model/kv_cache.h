// The paged KV cache: per layer, K and V as (num_blocks, block_size, num_kv_heads, head_dim) in BF16,
// or FP8 e4m3 holding k / k_scale (the scales live with the attention weights).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace nibble {

enum class KvCacheDType : uint8_t { kBf16, kFp8E4M3 };

struct KvCacheLayer {
  Tensor k;  // (num_blocks, block_size, num_kv_heads, head_dim)
  Tensor v;  // same
};

struct KvCache {
  KvCacheDType dtype = KvCacheDType::kBf16;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  std::vector<KvCacheLayer> layers;
};

inline DType kv_storage_dtype(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFp8E4M3 ? DType::kF8E4M3 : DType::kBF16;
}

}  // namespace nibble
