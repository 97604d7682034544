// A loaded model: its config, its weights on one backend, and the forward pass over a ForwardBatch.
// The forward pass is written once (model.cc) against Ops; architecture differences are data
// (ModelConfig), not code paths per backend.
#pragma once

#include <functional>
#include <memory>

#include "format/model_config.h"
#include "model/communicator.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

class Model {
 public:
  Model(ModelConfig config, ModelWeights weights, Ops& ops);
  virtual ~Model() = default;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Ops& ops() const { return ops_; }

  // A KV cache of `num_blocks` blocks of `block_size` tokens for every layer, on the backend.
  // (Virtual: a tensor-parallel group's rank 0 also sizes its peers' caches; tensor_parallel.h.)
  virtual KvCache allocate_kv_cache(int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const;

  // Runs the batch through the model, appending its tokens' K/V to `cache`.
  // Returns F32 (R, vocab_size) logits for batch.logit_rows, on the backend's device.
  virtual Tensor forward(const ForwardBatch& batch, KvCache& cache);

  // Records the device work `step` queues, for replay (CUDA graphs): the backend's Ops::record, or
  // nullptr where the model cannot be recorded (the CPU). A tensor-parallel group records every rank.
  virtual std::unique_ptr<RecordedStep> record(const std::function<void()>& step);

  // One rank of a tensor-parallel group: this model holds the rank's shard (tensor_parallel.h), and
  // the attention output and the MoE output are summed over the ranks. Not owned; null: one rank.
  void set_communicator(Communicator* communicator) { communicator_ = communicator; }

 private:
  ModelConfig config_;
  ModelWeights weights_;
  Ops& ops_;
  Communicator* communicator_ = nullptr;
};

}  // namespace nibble
