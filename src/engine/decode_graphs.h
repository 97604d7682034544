// Decode steps replayed from recorded graphs (CUDA graphs), one per batch-size bucket: a step of S
// sequences that each bring one token runs the graph of the smallest bucket B >= S, its inputs padded
// with rows that read and write only a reserved padding KV block. Graphs are recorded largest bucket
// first, so the workspaces the ops grow are at their final size before any graph captures them.
// The ops may choose their kernels by the longest context a graph is recorded for (the decode
// attention's grid does), so buckets of up to kShortContextBatch sequences have a second graph recorded
// for contexts of at most kShortContext keys, which steps whose sequences all fit replay.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace nibble {

// The host inputs of one decode step of S sequences (row s = sequence s).
struct DecodeInputs {
  std::vector<int32_t> token_ids;     // (S)
  std::vector<int32_t> positions;     // (S)
  std::vector<int32_t> seq_lens;      // (S)
  std::vector<int32_t> slot_mapping;  // (S)
  std::vector<std::vector<int32_t>> block_tables;  // S rows of at most max_blocks_per_seq blocks
};

class DecodeGraphs {
 public:
  // `pad_block` is a KV block no sequence owns. Records nothing until first used, and nothing at all
  // (covers() is false) on a backend that cannot record.
  DecodeGraphs(Model& model, KvCache& cache, int64_t max_batch, int64_t max_blocks_per_seq, int32_t pad_block);

  bool covers(int64_t num_seqs) const;
  // F32 (B, vocab) logits on the device, B >= S (the bucket's size): rows 0..S-1 are the inputs'.
  // Valid until the next run.
  const Tensor& run(const DecodeInputs& inputs);

 private:
  struct Graph {
    int64_t batch = 0;
    int64_t max_seq_len = 0;  // the longest context the graph is recorded for
    ForwardBatch inputs;  // device tensors the graph reads
    Tensor logits;        // device tensor the graph writes
    std::unique_ptr<RecordedStep> step;
  };

  Graph& graph_for(int64_t num_seqs, int64_t longest);
  void record(Graph& graph);
  // The host tensors of a padded step for `batch` rows (all rows padding when `inputs` is empty).
  void fill(Graph& graph, const DecodeInputs* inputs);

  Model& model_;
  KvCache& cache_;
  int64_t max_blocks_per_seq_;
  int32_t pad_block_;
  bool enabled_ = false;
  std::vector<Graph> graphs_;  // ascending by batch, then by context
};

}  // namespace nibble
