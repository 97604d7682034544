// Generator: runs one sequence through a Model: prefill of the prompt, then one token per step,
// on a KV cache sized for it. The multi-sequence engine (scheduler, block manager) builds on the
// same ForwardBatch; this is the simple path the `generate` and `logits` commands use.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/sampler.h"
#include "model/model.h"

namespace nibble {

class Generator {
 public:
  // Room for `max_tokens` tokens (prompt plus generated) in blocks of `block_size`.
  Generator(Model& model, int64_t max_tokens, KvCacheDType kv_dtype, int64_t block_size = 16);

  // Appends `ids` to the sequence and returns F32 (n, vocab) logits of its last `n` tokens, on the CPU
  // (n = 1: the next-token distribution; n = ids.size(): every position).
  Tensor extend(const std::vector<int32_t>& ids, int64_t n = 1);
  int64_t length() const { return length_; }

 private:
  Model& model_;
  KvCache cache_;
  int64_t block_size_;
  int64_t max_tokens_;
  int64_t length_ = 0;
};

// Generates up to `max_new_tokens` after `prompt`, calling `on_token` for each; stops early at any of
// `stop_ids`. Returns the generated ids (a stop id included).
std::vector<int32_t> generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              const SamplingParams& sampling, KvCacheDType kv_dtype,
                              const std::vector<int64_t>& stop_ids,
                              const std::function<void(int32_t)>& on_token = {});

}  // namespace nibble
