// Tensor parallelism: a model split over N ranks, each an ordinary ModelConfig + ModelWeights that
// any backend runs unchanged, plus the driver that runs the N ranks together.
// Split: attention heads (q heads / N per rank; KV heads / N when num_key_value_heads ≥ N, else each
// rank keeps the one KV head its q heads read), o_proj along its input (the rank's heads), experts
// along the intermediate size (w1/w3 rows, w2 columns). Replicated: routers, norms, embeddings, lm_head.
// Weights are sharded after quantization: the codes and per-row scales of the rank's rows/columns
// are exactly the unsharded model's, so the ranks' partial sums add up to the one-rank result.
#pragma once

#include <memory>
#include <vector>

#include "format/model_config.h"
#include "model/communicator.h"
#include "model/model.h"
#include "model/weights.h"

namespace nibble {

// Fails clearly unless `tp_size` ranks can split `config`: tp_size divides the attention heads and
// the intermediate size, the KV heads divide or are divided by it, and intermediate / tp_size is a
// multiple of `intermediate_multiple` (8 for INT4 packing; 64 for the GPU's expert kernels).
void check_tp_size(const ModelConfig& config, int tp_size, int64_t intermediate_multiple);

// Rank `rank`'s config: the same model with num_attention_heads, num_key_value_heads and
// intermediate_size per rank.
ModelConfig shard_config(const ModelConfig& config, int rank, int tp_size);

// Rank `rank`'s weights from the whole model's, both on the CPU in weights.h's formats (before
// Ops::prepare_moe). Replicated tensors are shared, not copied.
LayerWeights shard_layer(const LayerWeights& layer, const ModelConfig& config, int rank, int tp_size);
ModelWeights shard_weights(const ModelWeights& weights, const ModelConfig& config, int rank, int tp_size);

// Host weights (weights.h formats) onto a backend: every tensor uploaded, each layer's MoE through
// ops.prepare_moe.
ModelWeights place_weights(const ModelWeights& host, Ops& ops);

// The driver: rank 0's Model, which also holds ranks 1..N-1 and runs all N on every forward, one
// thread per rank, on the same ForwardBatch; it returns rank 0's logits (every rank computes the
// same). Its config() is rank 0's (per-rank heads). A rank that fails aborts the group, and the
// first error is rethrown. One KV cache at a time: allocate_kv_cache also (re)allocates the peers'.
class TensorParallelModel final : public Model {
 public:
  // `whole` and `host_weights`: the unsharded model on the CPU. ops[r] and communicators[r] serve
  // rank r; ops[0] is not owned (it must outlive this model), the others are.
  TensorParallelModel(const ModelConfig& whole, const ModelWeights& host_weights, Ops& rank0_ops,
                      std::vector<std::unique_ptr<Ops>> peer_ops,
                      std::vector<std::unique_ptr<Communicator>> communicators);

  KvCache allocate_kv_cache(int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const override;
  Tensor forward(const ForwardBatch& batch, KvCache& cache) override;
  int tp_size() const { return static_cast<int>(communicators_.size()); }

 private:
  std::vector<std::unique_ptr<Ops>> peer_ops_;                // ranks 1..N-1
  std::vector<std::unique_ptr<Communicator>> communicators_;  // ranks 0..N-1
  std::vector<std::unique_ptr<Model>> peers_;                 // ranks 1..N-1
  mutable std::vector<KvCache> peer_caches_;                  // ranks 1..N-1
  mutable const void* cache_id_ = nullptr;                    // rank 0's cache they go with
};

}  // namespace nibble
