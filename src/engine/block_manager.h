// BlockManager: owns the KV cache's blocks and their reference counts, and nothing else. A sequence
// gets blocks as its tokens need slots; finished or preempted sequences give them back. Full blocks
// are shared between sequences with the same prefix (prefix caching): a block's identity is the hash
// of all tokens up to its end, so equal hashes mean equal KV.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/sequence.h"

namespace nibble {

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size);

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return static_cast<int64_t>(ref_counts_.size()); }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }

  // Before a sequence's first step: reuse the cached blocks of its longest cached full-block prefix
  // (never the whole prompt: the last token is always computed, for its logits). Sets
  // num_computed_tokens to the tokens covered.
  void attach_prefix(Sequence& seq);
  // Whether `seq` can get slots for `new_tokens` more tokens, and getting them.
  bool can_append(const Sequence& seq, int64_t new_tokens) const;
  void append_slots(Sequence& seq, int64_t new_tokens);
  // After a step computed tokens up to seq.num_computed_tokens: full blocks become shareable.
  void register_full_blocks(const Sequence& seq);
  // Gives back every block of `seq` (shared blocks survive while others use them).
  void release(Sequence& seq);

 private:
  int64_t blocks_needed(const Sequence& seq, int64_t new_tokens) const;
  uint64_t prefix_hash(const Sequence& seq, int64_t block_index) const;
  int32_t take_free_block();

  int64_t block_size_;
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;                         // LIFO of free block ids
  std::unordered_map<uint64_t, int32_t> cached_;      // prefix hash -> block holding it
  std::vector<uint64_t> hash_of_;                     // block -> its prefix hash (0: none)
};

}  // namespace nibble
