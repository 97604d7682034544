// Sharding a loaded model over tensor-parallel ranks (slices of the quantized codes and their
// scales), and the driver that runs the ranks as threads around one forward call.
#include "model/tensor_parallel.h"

#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
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

TensorParallelModel::TensorParallelModel(const ModelConfig& whole, const ModelWeights& host_weights,
                                         Ops& rank0_ops, std::vector<std::unique_ptr<Ops>> peer_ops,
                                         std::vector<std::unique_ptr<Communicator>> communicators)
    : Model(shard_config(whole, 0, static_cast<int>(communicators.size())),
            place_weights(shard_weights(host_weights, whole, 0, static_cast<int>(communicators.size())),
                          rank0_ops),
            rank0_ops),
      peer_ops_(std::move(peer_ops)),
      communicators_(std::move(communicators)) {
  const int n = tp_size();
  check(static_cast<int>(peer_ops_.size()) == n - 1, "tensor parallel: ", n, " ranks need ", n - 1,
        " peer backends, got ", peer_ops_.size());
  for (int r = 0; r < n; ++r)
    check(communicators_[r]->rank() == r && communicators_[r]->size() == n,
          "tensor parallel: communicator ", r, " is rank ", communicators_[r]->rank(), " of ",
          communicators_[r]->size());
  set_communicator(communicators_[0].get());
  for (int r = 1; r < n; ++r) {
    Ops& ops = *peer_ops_[r - 1];
    peers_.push_back(std::make_unique<Model>(shard_config(whole, r, n),
                                             place_weights(shard_weights(host_weights, whole, r, n), ops),
                                             ops));
    peers_.back()->set_communicator(communicators_[r].get());
  }
}

KvCache TensorParallelModel::allocate_kv_cache(int64_t num_blocks, int64_t block_size,
                                               KvCacheDType dtype) const {
  peer_caches_.clear();
  for (const auto& peer : peers_) peer_caches_.push_back(peer->allocate_kv_cache(num_blocks, block_size, dtype));
  KvCache cache = Model::allocate_kv_cache(num_blocks, block_size, dtype);
  cache_id_ = cache.layers.empty() ? nullptr : cache.layers[0].k.raw();
  return cache;
}

Tensor TensorParallelModel::forward(const ForwardBatch& batch, KvCache& cache) {
  check(peer_caches_.size() == peers_.size() &&
            (cache.layers.empty() ? nullptr : cache.layers[0].k.raw()) == cache_id_,
        "tensor parallel: forward on a KV cache other than the one allocated last (the ranks keep "
        "one cache at a time)");
  std::mutex mutex;
  std::exception_ptr first_error;
  // Runs one rank; on failure records the first error and aborts the group, so no rank waits forever.
  const auto run = [&](int rank, const std::function<void()>& step) {
    try {
      step();
    } catch (...) {
      {
        std::lock_guard lock(mutex);
        if (!first_error) first_error = std::current_exception();
      }
      communicators_[rank]->abort();
    }
  };
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < peers_.size(); ++p)
    threads.emplace_back([&, p] {
      run(static_cast<int>(p) + 1, [&] { peers_[p]->forward(batch, peer_caches_[p]); });
    });
  Tensor logits;
  run(0, [&] { logits = Model::forward(batch, cache); });
  for (std::thread& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
  return logits;
}

}  // namespace nibble
