// ModelRunner: turns a scheduled step into one flat ForwardBatch (positions, slot mapping, block
// tables, the rows that need logits), runs the model, and samples one token for each sequence whose
// step reaches its last token, with that sequence's own sampler.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"

namespace nibble {

class ModelRunner {
 public:
  ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, KvCacheDType kv_dtype);

  // The sampled tokens, in the order of the sampling sequences of `step`.
  std::vector<int32_t> run(const std::vector<ScheduledSeq>& step);

 private:
  Model& model_;
  KvCache cache_;
};

}  // namespace nibble
