// KV block allocation with reference counts and prefix sharing.
#include "engine/block_manager.h"

#include <algorithm>

#include "core/error.h"

namespace nibble {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size)
    : block_size_(block_size), ref_counts_(num_blocks, 0), hash_of_(num_blocks, 0) {
  check(num_blocks >= 1 && block_size >= 1, "BlockManager: need at least one block of one token");
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

uint64_t BlockManager::prefix_hash(const Sequence& seq, int64_t block_index) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids of blocks 0..block_index
  for (int64_t i = 0; i < (block_index + 1) * block_size_; ++i) {
    h ^= static_cast<uint32_t>(seq.tokens()[i]);
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

int32_t BlockManager::take_free_block() {
  check(!free_.empty(), "BlockManager: out of KV blocks");
  const int32_t b = free_.back();
  free_.pop_back();
  if (hash_of_[b] != 0) {  // evict the stale prefix entry this block held
    auto it = cached_.find(hash_of_[b]);
    if (it != cached_.end() && it->second == b) cached_.erase(it);
    hash_of_[b] = 0;
  }
  ref_counts_[b] = 1;
  return b;
}

void BlockManager::attach_prefix(Sequence& seq) {
  // A request for prompt log-probabilities computes its whole prompt (a cached prefix has no logits).
  if (!seq.block_table.empty() || seq.params().prompt_logprobs >= 0) return;
  const int64_t full = (seq.num_tokens() - 1) / block_size_;  // leave the last token to compute
  for (int64_t i = 0; i < full; ++i) {
    auto it = cached_.find(prefix_hash(seq, i));
    if (it == cached_.end()) break;
    const int32_t b = it->second;
    if (ref_counts_[b] == 0) free_.erase(std::find(free_.begin(), free_.end(), b));
    ++ref_counts_[b];
    seq.block_table.push_back(b);
  }
  seq.num_computed_tokens = static_cast<int64_t>(seq.block_table.size()) * block_size_;
}

int64_t BlockManager::blocks_needed(const Sequence& seq, int64_t new_tokens) const {
  const int64_t total = seq.num_computed_tokens + new_tokens;
  return std::max<int64_t>(0, (total + block_size_ - 1) / block_size_ - static_cast<int64_t>(seq.block_table.size()));
}

bool BlockManager::can_append(const Sequence& seq, int64_t new_tokens) const {
  return blocks_needed(seq, new_tokens) <= num_free_blocks();
}

void BlockManager::append_slots(Sequence& seq, int64_t new_tokens) {
  for (int64_t n = blocks_needed(seq, new_tokens); n > 0; --n) seq.block_table.push_back(take_free_block());
}

void BlockManager::register_full_blocks(const Sequence& seq) {
  const int64_t full = seq.num_computed_tokens / block_size_;
  for (int64_t i = 0; i < full; ++i) {
    const int32_t b = seq.block_table[i];
    if (hash_of_[b] != 0) continue;
    const uint64_t h = prefix_hash(seq, i);
    if (cached_.count(h)) continue;  // an equal block is cached already
    cached_[h] = b;
    hash_of_[b] = h;
  }
}

void BlockManager::release(Sequence& seq) {
  // The free list is LIFO: pushing the first blocks first makes them the last to be reused, so the
  // shareable prefix outlives the tail.
  for (const int32_t b : seq.block_table)
    if (--ref_counts_[b] == 0) free_.push_back(b);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
}

}  // namespace nibble
