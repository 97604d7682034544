// Recording and replaying decode steps (decode_graphs.h).
#include "engine/decode_graphs.h"

#include <algorithm>

#include "core/tensor.h"

namespace nibble {
namespace {

// The short context class (decode_graphs.h): the longest context for which the CUDA decode attention
// merges a few sequences' slices in a thread-block cluster (attention_decode.cu, kClusterMaxKeys), where
// recorded for the model's whole context it takes the merge kernel: measured on an H200, Mixtral-8x7B
// batch 1 at 1025 keys, 9.5-10.5 µs a layer against 13.0 (bench/RESULTS.md). Its grid is one wave of
// blocks only up to a few sequences.
constexpr int64_t kShortContext = 8192;
constexpr int64_t kShortContextBatch = 8;

// 1, 2, 4, 8, 16, then every multiple of 8 up to max_batch (and max_batch itself).
std::vector<int64_t> buckets(int64_t max_batch) {
  std::vector<int64_t> out;
  for (int64_t b : {1, 2, 4, 8, 16})
    if (b <= max_batch) out.push_back(b);
  for (int64_t b = 24; b <= max_batch; b += 8) out.push_back(b);
  if (out.empty() || out.back() != max_batch) out.push_back(max_batch);
  return out;
}

}  // namespace

DecodeGraphs::DecodeGraphs(Model& model, KvCache& cache, int64_t max_batch, int64_t max_blocks_per_seq,
                           int32_t pad_block)
    : model_(model), cache_(cache), max_blocks_per_seq_(max_blocks_per_seq), pad_block_(pad_block) {
  // Probe once whether the model records at all (the CPU does not).
  enabled_ = max_batch > 0 && model.record([] {}) != nullptr;
  if (!enabled_) return;
  const int64_t context = max_blocks_per_seq * cache.block_size;
  for (int64_t b : buckets(max_batch)) {
    if (b <= kShortContextBatch && context > kShortContext)
      graphs_.push_back({.batch = b, .max_seq_len = kShortContext, .inputs = {}, .logits = {}, .step = nullptr});
    graphs_.push_back({.batch = b, .max_seq_len = context, .inputs = {}, .logits = {}, .step = nullptr});
  }
}

bool DecodeGraphs::covers(int64_t num_seqs) const {
  return enabled_ && num_seqs >= 1 && num_seqs <= graphs_.back().batch;
}

void DecodeGraphs::fill(Graph& g, const DecodeInputs* in) {
  const int64_t B = g.batch, W = max_blocks_per_seq_;
  const auto S = in ? static_cast<int64_t>(in->token_ids.size()) : 0;
  Tensor ids = Tensor::zeros(DType::kI32, {B}), positions = Tensor::zeros(DType::kI32, {B});
  Tensor seq_lens = Tensor::zeros(DType::kI32, {B}), slots = Tensor::zeros(DType::kI32, {B});
  Tensor tables = Tensor::zeros(DType::kI32, {B, W});
  std::fill_n(tables.data<int32_t>(), B * W, pad_block_);
  for (int64_t b = 0; b < B; ++b) {
    const bool real = b < S;
    ids.data<int32_t>()[b] = real ? in->token_ids[b] : 0;
    positions.data<int32_t>()[b] = real ? in->positions[b] : 0;
    seq_lens.data<int32_t>()[b] = real ? in->seq_lens[b] : 1;
    slots.data<int32_t>()[b] = real ? in->slot_mapping[b] : static_cast<int32_t>(pad_block_ * cache_.block_size);
    if (real) {
      const auto& row = in->block_tables[b];
      check(static_cast<int64_t>(row.size()) <= W, "decode step: a sequence holds ", row.size(),
            " KV blocks, more than the ", W, " a graph was recorded for");
      std::copy(row.begin(), row.end(), tables.data<int32_t>() + b * W);
    }
  }
  Ops& ops = model_.ops();
  if (!g.inputs.token_ids.defined()) {  // first fill: allocate the device inputs the graph will read
    Tensor query_start = Tensor::zeros(DType::kI32, {B + 1}), rows = Tensor::zeros(DType::kI32, {B});
    for (int64_t b = 0; b <= B; ++b) query_start.data<int32_t>()[b] = static_cast<int32_t>(b);
    for (int64_t b = 0; b < B; ++b) rows.data<int32_t>()[b] = static_cast<int32_t>(b);
    g.inputs = {.num_tokens = B, .num_seqs = B, .token_ids = ops.upload(ids), .positions = ops.upload(positions),
                .query_start = ops.upload(query_start), .seq_lens = ops.upload(seq_lens),
                .block_tables = ops.upload(tables), .slot_mapping = ops.upload(slots), .logit_rows = ops.upload(rows),
                .max_query_len = 1, .max_seq_len = g.max_seq_len};
    return;
  }
  ops.copy_to_device(ids, g.inputs.token_ids);
  ops.copy_to_device(positions, g.inputs.positions);
  ops.copy_to_device(seq_lens, g.inputs.seq_lens);
  ops.copy_to_device(tables, g.inputs.block_tables);
  ops.copy_to_device(slots, g.inputs.slot_mapping);
}

void DecodeGraphs::record(Graph& g) {
  fill(g, nullptr);
  model_.forward(g.inputs, cache_);  // warm-up: sizes workspaces and plans outside the capture
  g.step = model_.record([&] { g.logits = model_.forward(g.inputs, cache_); });
  check(g.step != nullptr, "decode graphs: the backend stopped recording");
}

DecodeGraphs::Graph& DecodeGraphs::graph_for(int64_t num_seqs, int64_t longest) {
  if (!graphs_.back().step)  // record every bucket at once, largest first
    for (auto it = graphs_.rbegin(); it != graphs_.rend(); ++it) record(*it);
  const auto it = std::find_if(graphs_.begin(), graphs_.end(),
                               [&](const Graph& g) { return g.batch >= num_seqs && g.max_seq_len >= longest; });
  check(it != graphs_.end(), "decode step: a context of ", longest, " keys, longer than the ",
        graphs_.back().max_seq_len, " the graphs were recorded for");
  return *it;
}

const Tensor& DecodeGraphs::run(const DecodeInputs& inputs) {
  const auto S = static_cast<int64_t>(inputs.token_ids.size());
  check(covers(S), "decode graphs: no graph for ", S, " sequences");
  const int64_t longest = *std::max_element(inputs.seq_lens.begin(), inputs.seq_lens.end());
  Graph& g = graph_for(S, longest);
  fill(g, &inputs);
  g.step->replay();
  return g.logits;
}

}  // namespace nibble
