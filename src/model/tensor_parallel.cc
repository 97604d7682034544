// Sharding a loaded model over tensor-parallel ranks (slices of the quantized codes and their
// scales), and the driver that runs the ranks as threads around one forward call.
#include "model/tensor_parallel.h"

#include <cstring>
#include <utility>

namespace nibble {
namespace {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};

// The concatenation of `ranges` of t along `dim` (logical elements; packed INT4 dimensions hold
// `pack` per stored element), as a new contiguous host tensor.
Tensor take(const Tensor& t, int dim, const std::vector<Range>& ranges, int64_t pack = 1) {
  check(t.device() == Device::kCpu, "tensor parallel: sharding needs host weights, got ", t.describe());
  const Shape& shape = t.shape();
  int64_t outer = 1, inner = static_cast<int64_t>(dtype_size(t.dtype()));
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (int i = dim + 1; i < t.rank(); ++i) inner *= shape[i];
  int64_t taken = 0;
  for (const Range& r : ranges) {
    check(r.begin % pack == 0 && r.end % pack == 0 && r.begin >= 0 && r.begin <= r.end &&
              r.end / pack <= shape[dim],
          "tensor parallel: slice [", r.begin, ", ", r.end, ") of ", t.describe(), " dimension ", dim,
          " is outside it or splits a packed word");
    taken += (r.end - r.begin) / pack;
  }
  Shape out_shape = shape;
  out_shape[dim] = taken;
  Tensor out = Tensor::zeros(t.dtype(), out_shape);
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (const Range& r : ranges) {
      const int64_t bytes = (r.end - r.begin) / pack * inner;
      std::memcpy(dst, src + (o * shape[dim] + r.begin / pack) * inner, static_cast<std::size_t>(bytes));
      dst += bytes;
    }
  return out;
}

int64_t pack_of(WeightFormat format) { return format == WeightFormat::kInt4 ? 8 : 1; }

// Output rows `ranges` of a linear layer (their codes and scales).
Linear take_rows(const Linear& w, const std::vector<Range>& ranges) {
  Linear out = w;
  out.weight = take(w.weight, 0, ranges);
  if (w.scale.defined()) out.scale = take(w.scale, 0, ranges);
  out.out_features = out.weight.dim(0);
  return out;
}

// Input columns `range` of a linear layer; the per-output-row scales stay whole.
Linear take_columns(const Linear& w, Range range) {
  Linear out = w;
  out.weight = take(w.weight, 1, {range}, pack_of(w.format));
  out.in_features = range.end - range.begin;
  return out;
}

// The rank's KV heads [first, first + count).
Range kv_heads_of(const ModelConfig& c, int rank, int tp_size) {
  const int64_t hkv = c.num_key_value_heads;
  if (hkv >= tp_size) return {rank * hkv / tp_size, (rank + 1) * hkv / tp_size};
  const int64_t group = c.num_attention_heads / hkv;  // q heads per KV head
  const int64_t kv = rank * (c.num_attention_heads / tp_size) / group;
  return {kv, kv + 1};
}

}  // namespace

void check_tp_size(const ModelConfig& c, int n, int64_t intermediate_multiple) {
  check(n >= 1, "--tp-size ", n, " must be at least 1");
  check(c.num_attention_heads % n == 0, "--tp-size ", n, " does not divide num_attention_heads (",
        c.num_attention_heads, ")");
  check(c.num_key_value_heads >= n ? c.num_key_value_heads % n == 0 : n % c.num_key_value_heads == 0,
        "--tp-size ", n, " and num_key_value_heads (", c.num_key_value_heads,
        ") must divide one another");
  check(c.intermediate_size % n == 0 && (c.intermediate_size / n) % intermediate_multiple == 0,
        "--tp-size ", n, " must split intermediate_size (", c.intermediate_size,
        ") into parts that are multiples of ", intermediate_multiple);
}

ModelConfig shard_config(const ModelConfig& c, int rank, int n) {
  check(rank >= 0 && rank < n, "tensor parallel: rank ", rank, " outside [0, ", n, ")");
  ModelConfig out = c;
  const Range kv = kv_heads_of(c, rank, n);
  out.num_attention_heads = c.num_attention_heads / n;
  out.num_key_value_heads = kv.end - kv.begin;
  out.intermediate_size = c.intermediate_size / n;
  return out;
}

LayerWeights shard_layer(const LayerWeights& layer, const ModelConfig& c, int rank, int n) {
  const int64_t D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t I = c.intermediate_size, heads = Hq / n, i0 = rank * (I / n), i1 = i0 + I / n;
  const Range kv = kv_heads_of(c, rank, n);
  LayerWeights out = layer;  // norms shared
  out.attention.qkv_proj = take_rows(layer.attention.qkv_proj,
                                     {{rank * heads * D, (rank + 1) * heads * D},
                                      {(Hq + kv.begin) * D, (Hq + kv.end) * D},
                                      {(Hq + Hkv + kv.begin) * D, (Hq + Hkv + kv.end) * D}});
  out.attention.o_proj = take_columns(layer.attention.o_proj, {rank * heads * D, (rank + 1) * heads * D});

  const Experts& ex = layer.moe.experts;
  Experts& sx = out.moe.experts;  // router shared
  check(ex.intermediate_size == I, "tensor parallel: experts of intermediate size ", ex.intermediate_size,
        ", config says ", I);
  const std::vector<Range> gate_up_rows{{i0, i1}, {I + i0, I + i1}};
  sx.gate_up = take(ex.gate_up, 1, gate_up_rows);
  if (ex.gate_up_scale.defined()) sx.gate_up_scale = take(ex.gate_up_scale, 1, gate_up_rows);
  sx.down = take(ex.down, 2, {{i0, i1}}, pack_of(ex.format));
  sx.intermediate_size = I / n;
  return out;
}

ModelWeights shard_weights(const ModelWeights& w, const ModelConfig& c, int rank, int n) {
  ModelWeights out;
  out.embed_tokens = w.embed_tokens;
  out.norm = w.norm;
  out.lm_head = w.lm_head;
  for (const LayerWeights& layer : w.layers) out.layers.push_back(shard_layer(layer, c, rank, n));
  return out;
}

ModelWeights place_weights(const ModelWeights& host, Ops& ops) {
  const auto up = [&](const Tensor& t) { return t.defined() ? ops.upload(t) : Tensor(); };
  const auto up_linear = [&](Linear l) {
    l.weight = up(l.weight);
    l.scale = up(l.scale);
    return l;
  };
  ModelWeights out;
  out.embed_tokens = up(host.embed_tokens);
  out.norm = up(host.norm);
  out.lm_head = up_linear(host.lm_head);
  for (const LayerWeights& layer : host.layers) {
    LayerWeights l = layer;
    l.pre_attn_norm = up(layer.pre_attn_norm);
    l.post_attn_norm = up(layer.post_attn_norm);
    l.pre_moe_norm = up(layer.pre_moe_norm);
    l.post_moe_norm = up(layer.post_moe_norm);
    l.attention.qkv_proj = up_linear(layer.attention.qkv_proj);
    l.attention.o_proj = up_linear(layer.attention.o_proj);
    l.moe = ops.prepare_moe(layer.moe);
    out.layers.push_back(std::move(l));
  }
  return out;
}

ModelWeights place_shard(const ModelWeights& host, const ModelConfig& whole, int rank, int n, Ops& ops) {
  ModelWeights replicated;  // the replicated tensors only, then one layer at a time
  replicated.embed_tokens = host.embed_tokens;
  replicated.norm = host.norm;
  replicated.lm_head = host.lm_head;
  ModelWeights out = place_weights(replicated, ops);
  for (const LayerWeights& layer : host.layers) {
    ModelWeights one;
    one.layers.push_back(shard_layer(layer, whole, rank, n));
    ModelWeights placed = place_weights(one, ops);
    out.layers.push_back(std::move(placed.layers[0]));
  }
  return out;
}

RankThread::RankThread() : thread_([this] { loop(); }) {}

RankThread::~RankThread() {
  {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !pending_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RankThread::post(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    check(!pending_, "tensor parallel: a rank was given a task before finishing its last");
    task_ = std::move(task);
    error_ = nullptr;
    pending_ = true;
  }
  cv_.notify_all();
}

std::exception_ptr RankThread::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !pending_; });
  return error_;
}

void RankThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stop_; });
    if (!pending_) return;  // stopped
    std::function<void()> task = std::move(task_);
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    task = nullptr;  // destroyed on this thread, like everything the task made
    lock.lock();
    error_ = error;
    pending_ = false;
    cv_.notify_all();
  }
}

// One peer rank's state; made, used and destroyed on its own thread only.
struct Peer {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Communicator> communicator;
  std::unique_ptr<Model> model;
  KvCache cache;
};

struct TensorParallelModel::Group {
  std::vector<std::unique_ptr<RankThread>> threads;  // ranks 1..N-1
  std::vector<std::unique_ptr<Peer>> peers;          // ranks 1..N-1, each touched by its thread only
  std::unique_ptr<Communicator> rank0_communicator;

  // Every rank's state goes at once (NCCL destroys its communicators together), each on its thread.
  ~Group() {
    for (std::size_t p = 0; p < threads.size(); ++p) {
      (void)threads[p]->wait();
      threads[p]->post([this, p] { peers[p].reset(); });
    }
    rank0_communicator.reset();
    for (auto& thread : threads) (void)thread->wait();
  }
};

struct TensorParallelModel::Built {
  ModelWeights rank0_weights;
  std::unique_ptr<Group> group;
};

namespace {

// The device tensors of a ForwardBatch.
constexpr Tensor ForwardBatch::*kBatchTensors[] = {
    &ForwardBatch::token_ids,    &ForwardBatch::positions,    &ForwardBatch::query_start, &ForwardBatch::seq_lens,
    &ForwardBatch::block_tables, &ForwardBatch::slot_mapping, &ForwardBatch::logit_rows};

// The batch's tensors on the host (downloaded from a device backend).
ForwardBatch batch_on_host(const ForwardBatch& b, Ops& ops) {
  if (ops.device() == Device::kCpu) return b;
  const auto down = [&](const Tensor& t) { return t.defined() ? ops.download(t) : Tensor(); };
  ForwardBatch out = b;
  for (Tensor ForwardBatch::*field : kBatchTensors)
    out.*field = down(b.*field);
  return out;
}

// A host batch on `ops`'s device.
ForwardBatch batch_on(const ForwardBatch& host, Ops& ops) {
  if (ops.device() == Device::kCpu) return host;
  const auto up = [&](const Tensor& t) { return t.defined() ? ops.upload(t) : Tensor(); };
  ForwardBatch out = host;
  for (Tensor ForwardBatch::*field : kBatchTensors)
    out.*field = up(host.*field);
  return out;
}

// Records the first error of a group's ranks.
class FirstError {
 public:
  void record(std::exception_ptr error) {
    std::lock_guard lock(mutex_);
    if (!first_) first_ = std::move(error);
  }
  bool any() {
    std::lock_guard lock(mutex_);
    return first_ != nullptr;
  }
  [[noreturn]] void rethrow() { std::rethrow_exception(first_); }

 private:
  std::mutex mutex_;
  std::exception_ptr first_;
};

}  // namespace

TensorParallelModel::Built TensorParallelModel::build(const ModelConfig& whole, const TpSetup& setup,
                                                      Ops& rank0_ops) {
  const int n = setup.size;
  check(n >= 1 && setup.make_ops && setup.make_communicator && setup.make_weights,
        "tensor parallel: incomplete setup for ", n, " ranks");
  Built built{.rank0_weights = {}, .group = std::make_unique<Group>()};
  Group& g = *built.group;
  FirstError errors;
  const auto failed = [&] {
    errors.record(std::current_exception());
    if (setup.abort) setup.abort();
  };
  for (int r = 1; r < n; ++r) {
    g.threads.push_back(std::make_unique<RankThread>());
    g.peers.push_back(std::make_unique<Peer>());
    g.threads.back()->post([&, r, &peer = *g.peers.back()] {
      try {
        if (setup.enter) setup.enter(r);
        peer.ops = setup.make_ops(r);
        peer.communicator = setup.make_communicator(r);
        check(peer.communicator->rank() == r && peer.communicator->size() == n, "tensor parallel: communicator ",
              r, " is rank ", peer.communicator->rank(), " of ", peer.communicator->size());
        const ModelConfig config = shard_config(whole, r, n);
        peer.model = std::make_unique<Model>(config, setup.make_weights(r, config, *peer.ops), *peer.ops);
        peer.model->set_communicator(peer.communicator.get());
      } catch (...) {
        failed();
      }
    });
  }
  try {
    g.rank0_communicator = setup.make_communicator(0);
    check(g.rank0_communicator->rank() == 0 && g.rank0_communicator->size() == n,
          "tensor parallel: communicator 0 is rank ", g.rank0_communicator->rank(), " of ",
          g.rank0_communicator->size());
    built.rank0_weights = setup.make_weights(0, shard_config(whole, 0, n), rank0_ops);
  } catch (...) {
    failed();
  }
  for (auto& thread : g.threads) (void)thread->wait();
  if (errors.any()) {
    built.group.reset();  // each rank's partial state, on its thread
    errors.rethrow();
  }
  return built;
}

TensorParallelModel::TensorParallelModel(const ModelConfig& whole, const TpSetup& setup, Ops& rank0_ops)
    : TensorParallelModel(whole, build(whole, setup, rank0_ops), rank0_ops) {
  size_ = setup.size;
  synchronize_ = setup.synchronize;
  copy_from_rank0_ = setup.copy_from_rank0;
}

TensorParallelModel::TensorParallelModel(const ModelConfig& whole, Built built, Ops& rank0_ops)
    : Model(shard_config(whole, 0, static_cast<int>(built.group->threads.size()) + 1),
            std::move(built.rank0_weights), rank0_ops),
      size_(static_cast<int>(built.group->threads.size()) + 1),
      group_(std::move(built.group)) {
  set_communicator(group_->rank0_communicator.get());
}

namespace {

// The setup of ranks whose backends and communicators already exist (made on one thread).
TpSetup setup_from(const ModelWeights& host_weights, const ModelConfig& whole,
                   std::vector<std::unique_ptr<Ops>>& peer_ops,
                   std::vector<std::unique_ptr<Communicator>>& communicators) {
  const int n = static_cast<int>(communicators.size());
  check(static_cast<int>(peer_ops.size()) == n - 1, "tensor parallel: ", n, " ranks need ", n - 1,
        " peer backends, got ", peer_ops.size());
  return {.size = n,
          .enter = {},
          .make_ops = [&](int rank) { return std::move(peer_ops[static_cast<std::size_t>(rank - 1)]); },
          .make_communicator = [&](int rank) { return std::move(communicators[static_cast<std::size_t>(rank)]); },
          .make_weights = [&host_weights, &whole, n](int rank, const ModelConfig&, Ops& ops) {
            return place_shard(host_weights, whole, rank, n, ops);
          },
          .synchronize = {},
          .abort = [&] {
            for (auto& c : communicators)
              if (c) c->abort();
          }};
}

}  // namespace

TensorParallelModel::TensorParallelModel(const ModelConfig& whole, const ModelWeights& host_weights,
                                         Ops& rank0_ops, std::vector<std::unique_ptr<Ops>> peer_ops,
                                         std::vector<std::unique_ptr<Communicator>> communicators)
    : TensorParallelModel(whole, setup_from(host_weights, whole, peer_ops, communicators), rank0_ops) {}

TensorParallelModel::~TensorParallelModel() = default;

void TensorParallelModel::run_all(const std::function<void()>& rank0,
                                  const std::function<void(std::size_t)>& peer) const {
  check(!failed_, "tensor parallel: a rank failed in an earlier step; the group cannot run again");
  Group& g = *group_;
  FirstError errors;
  for (std::size_t p = 0; p < g.threads.size(); ++p)
    g.threads[p]->post([&, p] {
      try {
        peer(p);
      } catch (...) {
        errors.record(std::current_exception());
        g.peers[p]->communicator->abort();
      }
    });
  try {
    rank0();
  } catch (...) {
    errors.record(std::current_exception());
    g.rank0_communicator->abort();
  }
  for (auto& thread : g.threads) (void)thread->wait();
  if (errors.any()) {
    failed_ = true;
    errors.rethrow();
  }
}

KvCache TensorParallelModel::allocate_kv_cache(int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const {
  KvCache cache;
  run_all([&] { cache = Model::allocate_kv_cache(num_blocks, block_size, dtype); },
          [&](std::size_t p) {
            Peer& peer = *group_->peers[p];
            peer.cache = {};  // the old cache goes first
            peer.cache = peer.model->allocate_kv_cache(num_blocks, block_size, dtype);
          });
  cache_id_ = cache.layers.empty() ? nullptr : cache.layers[0].k.raw();
  return cache;
}

Tensor TensorParallelModel::forward(const ForwardBatch& batch, KvCache& cache) {
  check((cache.layers.empty() ? nullptr : cache.layers[0].k.raw()) == cache_id_,
        "tensor parallel: forward on a KV cache other than the one allocated last (the ranks keep "
        "one cache at a time)");
  Tensor logits;
  if (recording_) {  // inside rank 0's capture: no host copies, nothing waited for
    for (const RecordedPeer& recorded : recorded_peers_)
      check(recorded.step == nullptr, "tensor parallel: a recorded step runs one forward");
    run_all([&] { logits = Model::forward(batch, cache); },
            [&](std::size_t p) {
              Peer& peer = *group_->peers[p];
              RecordedPeer& recorded = recorded_peers_[p];
              ForwardBatch local = batch;  // the graph's own inputs, refreshed from rank 0's before each replay
              for (Tensor ForwardBatch::*field : kBatchTensors)
                if ((batch.*field).defined()) {
                  local.*field = peer.ops->empty((batch.*field).dtype(), (batch.*field).shape());
                  copy_from_rank0_(batch.*field, local.*field);
                  recorded.inputs.emplace_back(batch.*field, local.*field);
                }
              recorded.step = peer.ops->record([&] { (void)peer.model->forward(local, peer.cache); });
              check(recorded.step != nullptr, "tensor parallel: rank ", p + 1, " could not record its step");
            });
    return logits;
  }
  const ForwardBatch host = batch_on_host(batch, ops());
  run_all(
      [&] {
        logits = Model::forward(batch, cache);
        if (synchronize_) synchronize_(0);
      },
      [&](std::size_t p) {
        Peer& peer = *group_->peers[p];
        const ForwardBatch local = batch_on(host, *peer.ops);
        (void)peer.model->forward(local, peer.cache);
        if (synchronize_) synchronize_(static_cast<int>(p) + 1);
      });
  return logits;
}

struct TensorParallelModel::Recorded final : RecordedStep {
  Recorded(TensorParallelModel& m, std::unique_ptr<RecordedStep> r0, std::vector<RecordedPeer> p)
      : model(m), rank0(std::move(r0)), peers(std::move(p)) {}
  ~Recorded() override { model.release(peers); }
  void replay() override { model.replay(*this); }

  TensorParallelModel& model;
  std::unique_ptr<RecordedStep> rank0;
  std::vector<RecordedPeer> peers;
};

void TensorParallelModel::release(std::vector<RecordedPeer>& peers) {
  Group& g = *group_;
  for (std::size_t p = 0; p < peers.size() && p < g.threads.size(); ++p) {
    (void)g.threads[p]->wait();
    g.threads[p]->post([&, p] { peers[p] = {}; });
  }
  for (auto& thread : g.threads) (void)thread->wait();
}

std::unique_ptr<RecordedStep> TensorParallelModel::record(const std::function<void()>& step) {
  if (!copy_from_rank0_) return nullptr;
  check(!failed_, "tensor parallel: a rank failed in an earlier step; the group cannot run again");
  recorded_peers_.clear();
  recorded_peers_.resize(group_->peers.size());
  recording_ = true;
  std::unique_ptr<RecordedStep> rank0;
  try {
    rank0 = Model::record(step);
  } catch (...) {
    recording_ = false;
    release(recorded_peers_);
    throw;
  }
  recording_ = false;
  if (!rank0) {
    release(recorded_peers_);
    return nullptr;
  }
  return std::make_unique<Recorded>(*this, std::move(rank0), std::move(recorded_peers_));
}

void TensorParallelModel::replay(Recorded& r) {
  // The peers copy their graphs' inputs from rank 0's tensors, which the caller refilled with copies
  // queued on rank 0's stream: let them land first.
  if (synchronize_) synchronize_(0);
  run_all(
      [&] {
        r.rank0->replay();
        if (synchronize_) synchronize_(0);
      },
      [&](std::size_t p) {
        RecordedPeer& peer = r.peers[p];
        if (!peer.step) return;
        for (auto& [rank0_input, input] : peer.inputs) copy_from_rank0_(rank0_input, input);
        peer.step->replay();
        if (synchronize_) synchronize_(static_cast<int>(p) + 1);
      });
}

}  // namespace nibble
