// ModelRunner: turns a scheduled step into one flat ForwardBatch (positions, slot mapping, block
// tables, the rows that need logits), runs the model, and samples one token for each sequence whose
// step reaches its last token, with that sequence's own sampler. Decode steps (one token per sequence)
// replay recorded graphs where the backend records them (decode_graphs.h).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/decode_graphs.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace nibble {

enum class CudaGraphs : uint8_t { kOn, kOff };

struct RunnerOptions {
  CudaGraphs cuda_graphs = CudaGraphs::kOn;
  int64_t max_graph_batch = 64;  // the largest decode batch replayed from a graph
  int64_t max_context = 0;       // tokens a sequence may hold; 0: the model's max_position_embeddings
};

class ModelRunner {
 public:
  // The cache holds num_blocks blocks for sequences plus one padding block for graph replays.
  ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, KvCacheDType kv_dtype,
              RunnerOptions options = {});

  // The sampled tokens, in the order of the sampling sequences of `step`.
  std::vector<int32_t> run(const std::vector<ScheduledSeq>& step);

 private:
  // logits (R, vocab) F32 where the model wrote them, row i for the i-th sampling sequence (rows past
  // those are padding). A step of greedy samplers takes the argmax there; any other step the draws
  // of Ops::sample (each row's temperature, key, top-k and top-p). Either way R ids come back.
  std::vector<int32_t> sample(const std::vector<ScheduledSeq>& step, const Tensor& logits);
  std::vector<int32_t> run_decode_graph(const std::vector<ScheduledSeq>& step);

  Model& model_;
  KvCache cache_;
  DecodeGraphs graphs_;
};

}  // namespace nibble
