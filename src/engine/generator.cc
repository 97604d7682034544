// Single-sequence prefill/decode driver.
#include "engine/generator.h"

#include <algorithm>
#include <numeric>

#include "engine/sequence.h"

namespace nibble {
Generator::Generator(Model& model, int64_t max_tokens, KvCacheDType kv_dtype, int64_t block_size)
    : model_(model), block_size_(block_size), max_tokens_(max_tokens) {
  check(max_tokens >= 1, "max_tokens must be positive");
  cache_ = model.allocate_kv_cache((max_tokens + block_size - 1) / block_size, block_size, kv_dtype);
}

Tensor Generator::extend(const std::vector<int32_t>& ids, int64_t n) {
  const auto count = static_cast<int64_t>(ids.size());
  check(count >= 1 && n >= 1 && n <= count, "extend: bad token count");
  check(length_ + count <= max_tokens_, "sequence of ", length_ + count, " tokens exceeds the ",
        max_tokens_, " the KV cache was sized for");
  check(length_ + count <= model_.config().max_position_embeddings, "sequence of ",
        length_ + count, " tokens exceeds max_position_embeddings (",
        model_.config().max_position_embeddings, ")");
  Ops& ops = model_.ops();
  std::vector<int32_t> positions(count), slots(count), rows(n), blocks(cache_.num_blocks);
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(length_));
  std::iota(blocks.begin(), blocks.end(), 0);  // one sequence owns the blocks in order
  slots = positions;                           // so a token's slot is its position
  std::iota(rows.begin(), rows.end(), static_cast<int32_t>(count - n));
  ForwardBatch batch{
      .num_tokens = count,
      .num_seqs = 1,
      .token_ids = ops.upload(host_i32(ids, {count})),
      .positions = ops.upload(host_i32(positions, {count})),
      .query_start = ops.upload(host_i32({0, static_cast<int32_t>(count)}, {2})),
      .seq_lens = ops.upload(host_i32({static_cast<int32_t>(length_ + count)}, {1})),
      .block_tables = ops.upload(host_i32(blocks, {1, cache_.num_blocks})),
      .slot_mapping = ops.upload(host_i32(slots, {count})),
      .logit_rows = ops.upload(host_i32(rows, {n})),
      .max_query_len = count,
      .max_seq_len = length_ + count};
  Tensor logits = ops.download(model_.forward(batch, cache_));
  length_ += count;
  return logits;
}

std::vector<int32_t> generate(Model& model, const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              const SamplingParams& sampling, KvCacheDType kv_dtype,
                              const std::vector<int64_t>& stop_ids,
                              const std::function<void(int32_t)>& on_token) {
  check(!prompt.empty(), "the prompt is empty (no tokens to condition on)");
  check(max_new_tokens >= 0, "max_new_tokens must be >= 0");
  Generator generator(model, static_cast<int64_t>(prompt.size()) + max_new_tokens, kv_dtype);
  Sampler sampler(sampling);
  // The tokens seen so far, for the penalties (the engine's Sequence keeps them the same way).
  Sequence seen(0, prompt, {.sampling = sampling, .max_tokens = std::max<int64_t>(max_new_tokens, 1)});
  const Penalties& penalties = sampling.penalties;
  std::vector<int32_t> out;
  std::vector<int32_t> next = prompt;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    Tensor logits = generator.extend(next);
    float* row = logits.data<float>();
    if (seen.adjusts_logits())
      for (const SeenToken& t : seen.seen_tokens())
        row[t.token] = penalized_logit(row[t.token], t.generated, t.bias, penalties.repetition, penalties.frequency,
                                       penalties.presence);
    const int32_t id = sampler.sample({row, static_cast<std::size_t>(logits.dim(1))});
    seen.append(id);
    out.push_back(id);
    if (on_token) on_token(id);
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) break;
    next = {id};
  }
  return out;
}

}  // namespace nibble
