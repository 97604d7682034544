// What one forward step computes: a flat batch of new tokens from one or more sequences, with the
// paged-KV metadata attention needs. Passed explicitly to every op that needs it (no global context).
// All tensors live on the backend's device and are I32.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace nibble {

struct ForwardBatch {
  int64_t num_tokens = 0;  // T: new tokens across all sequences
  int64_t num_seqs = 0;    // S
  Tensor token_ids;     // (T)
  Tensor positions;     // (T): position of each token in its sequence
  Tensor query_start;   // (S + 1): sequence s owns flat tokens [query_start[s], query_start[s+1])
  Tensor seq_lens;      // (S): tokens in sequence s's KV after this step (its context plus new tokens)
  Tensor block_tables;  // (S, max_blocks_per_seq): KV block ids of each sequence, in order
  Tensor slot_mapping;  // (T): KV slot (block × block_size + offset) each new token is written to
  Tensor logit_rows;    // (R): flat token rows whose logits are returned
  // Host-side copies of the sizes the ops need to size their launches.
  int64_t max_query_len = 0;
  int64_t max_seq_len = 0;
};

}  // namespace nibble
