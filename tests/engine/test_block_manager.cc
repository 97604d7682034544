// Block manager: allocation, reference counts, prefix sharing and release back to the baseline.
#include <gtest/gtest.h>

#include "engine/block_manager.h"

namespace nibble {
namespace {

Sequence make(int64_t id, std::vector<int32_t> tokens) { return Sequence(id, std::move(tokens), {.max_tokens = 4}); }

TEST(BlockManager, AllocatesWhatTokensNeedAndReleasesIt) {
  BlockManager blocks(8, 4);
  Sequence a = make(0, {1, 2, 3, 4, 5, 6});
  blocks.attach_prefix(a);
  EXPECT_EQ(a.num_computed_tokens, 0);
  ASSERT_TRUE(blocks.can_append(a, 6));
  blocks.append_slots(a, 6);
  EXPECT_EQ(a.block_table.size(), 2u);
  EXPECT_EQ(blocks.num_free_blocks(), 6);
  a.num_computed_tokens = 6;
  blocks.append_slots(a, 2);  // slots 6 and 7 fit in the second block
  EXPECT_EQ(a.block_table.size(), 2u);
  blocks.append_slots(a, 3);
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_FALSE(blocks.can_append(a, 100));
  blocks.release(a);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
}

TEST(BlockManager, SharesFullPrefixBlocks) {
  BlockManager blocks(8, 4);
  Sequence a = make(0, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  blocks.attach_prefix(a);
  blocks.append_slots(a, 9);
  a.num_computed_tokens = 9;
  blocks.register_full_blocks(a);  // blocks 0 and 1 are full
  // Same first 8 tokens: both full blocks are shared; the tail is computed.
  Sequence b = make(1, {1, 2, 3, 4, 5, 6, 7, 8, 42, 43});
  blocks.attach_prefix(b);
  EXPECT_EQ(b.num_computed_tokens, 8);
  ASSERT_EQ(b.block_table.size(), 2u);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  // A prompt equal to a cached prefix still computes its last token (for its logits).
  Sequence c = make(2, {1, 2, 3, 4, 5, 6, 7, 8});
  blocks.attach_prefix(c);
  EXPECT_EQ(c.num_computed_tokens, 4);
  // Different first token: nothing shared.
  Sequence d = make(3, {9, 2, 3, 4, 5});
  blocks.attach_prefix(d);
  EXPECT_EQ(d.num_computed_tokens, 0);
  blocks.release(a);
  blocks.release(b);
  blocks.release(c);
  blocks.release(d);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
  // Freed blocks keep their prefix until reused.
  Sequence e = make(4, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  blocks.attach_prefix(e);
  EXPECT_EQ(e.num_computed_tokens, 8);
  blocks.release(e);
  EXPECT_EQ(blocks.num_free_blocks(), 8);
}

}  // namespace
}  // namespace nibble
