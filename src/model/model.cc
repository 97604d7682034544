// The MoE transformer forward pass (Mixtral): pre-norm attention and MoE blocks with residuals.
#include "model/model.h"

#include <cmath>

namespace nibble {

Model::Model(ModelConfig config, ModelWeights weights, Ops& ops)
    : config_(std::move(config)), weights_(std::move(weights)), ops_(ops) {}

KvCache Model::allocate_kv_cache(int64_t num_blocks, int64_t block_size, KvCacheDType dtype) const {
  KvCache cache{.dtype = dtype, .num_blocks = num_blocks, .block_size = block_size, .layers = {}};
  const Shape shape{num_blocks, block_size, config_.num_key_value_heads, config_.head_dim};
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    cache.layers.push_back({.k = ops_.empty(kv_storage_dtype(dtype), shape),
                            .v = ops_.empty(kv_storage_dtype(dtype), shape)});
  return cache;
}

Tensor Model::forward(const ForwardBatch& batch, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t tokens = batch.num_tokens;
  const DType act = ops_.activation_dtype();
  const int64_t q_size = c.num_attention_heads * c.head_dim;
  const int64_t qkv_size = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const MoeParams moe{.top_k = c.num_experts_per_tok,
                      .router_norm = RouterNorm::kRenormalize,
                      .activation = Activation::kSilu};

  Tensor x = ops_.empty(act, {tokens, c.hidden_size});  // the residual stream
  Tensor h = ops_.empty(act, {tokens, c.hidden_size});
  Tensor y = ops_.empty(act, {tokens, c.hidden_size});
  Tensor qkv = ops_.empty(act, {tokens, qkv_size});
  Tensor attn = ops_.empty(act, {tokens, q_size});

  ops_.embedding(batch.token_ids, weights_.embed_tokens, x);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const LayerWeights& layer = weights_.layers[i];
    const AttentionParams attention{
        .num_heads = c.num_attention_heads,
        .num_kv_heads = c.num_key_value_heads,
        .head_dim = c.head_dim,
        .softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
        .k_scale = layer.attention.k_scale,
        .v_scale = layer.attention.v_scale};

    ops_.rms_norm(x, layer.input_layernorm, eps, h);
    ops_.linear(h, layer.attention.qkv_proj, qkv);
    ops_.rope(qkv, batch.positions, attention, c.rope_theta);
    ops_.attention(qkv, cache.layers[i], cache.dtype, batch, attention, attn);
    ops_.linear(attn, layer.attention.o_proj, y);
    ops_.add(x, y);

    ops_.rms_norm(x, layer.post_attention_layernorm, eps, h);
    ops_.moe(h, layer.moe, moe, y);
    ops_.add(x, y);
  }
  ops_.rms_norm(x, weights_.norm, eps, h);
  Tensor logits = ops_.empty(DType::kF32, {batch.logit_rows.dim(0), c.vocab_size});
  ops_.logits(h, batch.logit_rows, weights_.lm_head, logits);
  return logits;
}

}  // namespace nibble
