// Tensor parallelism: a model split over N ranks, each an ordinary ModelConfig + ModelWeights that
// any backend runs unchanged, plus the driver that runs the N ranks together (one persistent thread
// per rank: CPU ranks, or one GPU per rank through src/cuda/tp_cuda.h).
// Split: attention heads (q heads / N per rank; KV heads / N when num_key_value_heads ≥ N, else each
// rank keeps the one KV head its q heads read), o_proj along its input (the rank's heads), experts
// along the intermediate size (w1/w3 rows, w2 columns). Replicated: routers, norms, embeddings, lm_head.
// Weights are sharded after quantization: the codes and per-row scales of the rank's rows/columns
// are exactly the unsharded model's, so the ranks' partial sums add up to the one-rank result.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
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

// Rank 0's weights on `ops` from the whole model's host weights, one layer sharded and uploaded at a
// time (host memory holds the whole model plus one layer's shard).
ModelWeights place_shard(const ModelWeights& host, const ModelConfig& whole, int rank, int tp_size, Ops& ops);

// A persistent thread of one rank: runs the tasks posted to it, one at a time. Backend state that
// belongs to a thread (a CUDA device and its stream) stays with it for the life of the model.
class RankThread {
 public:
  RankThread();
  ~RankThread();  // waits for the posted task, then joins
  RankThread(const RankThread&) = delete;
  RankThread& operator=(const RankThread&) = delete;
  void post(std::function<void()> task);  // the previous task must have been waited for
  std::exception_ptr wait();              // until the posted task ended; what it threw, if anything

 private:
  void loop();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool pending_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// How each rank of a group gets its backend, communicator and weights. Every function runs on the
// rank's own thread (rank 0: the thread that builds the model), in this order.
struct TpSetup {
  int size = 1;
  std::function<void(int rank)> enter;                                       // optional (CUDA: device `rank`)
  std::function<std::unique_ptr<Ops>(int rank)> make_ops;                    // ranks 1..N-1
  std::function<std::unique_ptr<Communicator>(int rank)> make_communicator;  // every rank at once
  std::function<ModelWeights(int rank, const ModelConfig& rank_config, Ops& ops)> make_weights;
  std::function<void(int rank)> synchronize;  // optional: waits for the rank's queued work, fails on its errors
  // Optional (needed to record graphs): dst (on the rank's device) = src (on rank 0's), queued on the
  // rank's stream: before each replay a peer copies its graph's inputs from rank 0's.
  std::function<void(const Tensor& src, Tensor& dst)> copy_from_rank0;
  std::function<void()> abort;  // a rank failed during setup: ends the others' waits in make_communicator
};

// The driver: rank 0's Model, which also holds ranks 1..N-1, each on its own persistent thread, and
// runs all N on every forward (rank 0 on the calling thread) on the same batch; it returns rank 0's
// logits (every rank computes the same). Its config() is rank 0's (per-rank heads). A rank that
// fails aborts the group (Communicator::abort) and the first error is rethrown; a failed group
// refuses further steps. One KV cache at a time: allocate_kv_cache also (re)allocates the peers'.
class TensorParallelModel final : public Model {
 public:
  // The general form: `setup` says how to make each rank; rank0_ops must outlive the model.
  TensorParallelModel(const ModelConfig& whole, const TpSetup& setup, Ops& rank0_ops);
  // Every rank from the unsharded host weights; ops[r] and communicators[r] serve rank r; ops[0] is
  // not owned, the others are (made on this thread: for backends without per-thread state).
  TensorParallelModel(const ModelConfig& whole, const ModelWeights& host_weights, Ops& rank0_ops,
                      std::vector<std::unique_ptr<Ops>> peer_ops,
                      std::vector<std::unique_ptr<Communicator>> communicators);
  ~TensorParallelModel() override;

  KvCache allocate_kv_cache(int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const override;
  Tensor forward(const ForwardBatch& batch, KvCache& cache) override;
  // Every rank records its own graph of its forward (its all-reduces inside): rank 0 records `step`
  // on this thread, and the forward it calls has each peer record its forward on its thread, from
  // input tensors of its own. A replay waits for rank 0's queued input copies, has each peer copy
  // rank 0's inputs into its own, then replays every rank's graph. nullptr where the backend cannot
  // record or copy_from_rank0 is missing. The recorded step must not outlive the model.
  std::unique_ptr<RecordedStep> record(const std::function<void()>& step) override;
  int tp_size() const { return size_; }

  struct Group;  // the peers, their threads and rank 0's communicator (tensor_parallel.cc)

 private:
  struct Built;
  struct Recorded;
  struct RecordedPeer {
    std::unique_ptr<RecordedStep> step;                   // null where the recorded step ran no forward
    std::vector<std::pair<Tensor, Tensor>> inputs;        // (rank 0's tensor, the peer's copy its graph reads)
  };
  void replay(Recorded& recorded);
  void release(std::vector<RecordedPeer>& peers);  // each on its rank's thread
  TensorParallelModel(const ModelConfig& whole, Built built, Ops& rank0_ops);
  static Built build(const ModelConfig& whole, const TpSetup& setup, Ops& rank0_ops);
  // Runs `rank0` here and `peer(p)` on every peer's thread; on any failure aborts the group, marks
  // it failed and rethrows the first error.
  void run_all(const std::function<void()>& rank0, const std::function<void(std::size_t)>& peer) const;

  int size_;
  std::function<void(int)> synchronize_;
  std::function<void(const Tensor&, Tensor&)> copy_from_rank0_;
  bool recording_ = false;                                   // inside record(): forward records the peers
  std::vector<RecordedPeer> recorded_peers_;  // what they recorded
  std::unique_ptr<Group> group_;
  mutable const void* cache_id_ = nullptr;  // rank 0's cache the peers' caches go with
  mutable bool failed_ = false;
};

}  // namespace nibble
