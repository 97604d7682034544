// The MoE transformer forward pass, once for every architecture: attention and MoE blocks with
// residuals, pre-norms (Mixtral) or pre- and post-norms (Grok-1), with the scales, soft-caps and
// activation that ModelConfig names.
#include "model/model.h"

#include <cmath>

namespace nibble {
namespace {

Activation activation_of(HiddenAct act) {
  switch (act) {
    case HiddenAct::kSilu:
      return Activation::kSilu;
    case HiddenAct::kGelu:
      return Activation::kGelu;
    case HiddenAct::kGeluTanh:
      return Activation::kGeluTanh;
  }
  return Activation::kSilu;
}

}  // namespace

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

std::unique_ptr<RecordedStep> Model::record(const std::function<void()>& step) { return ops_.record(step); }

Tensor Model::forward(const ForwardBatch& batch, KvCache& cache) {
  const ModelConfig& c = config_;
  const int64_t tokens = batch.num_tokens;
  const DType act = ops_.activation_dtype();
  const int64_t q_size = c.num_attention_heads * c.head_dim;
  const int64_t qkv_size = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const auto softmax_scale = static_cast<float>(
      c.attn_output_multiplier.value_or(1.0 / std::sqrt(static_cast<double>(c.head_dim))));
  // The rank group under tensor parallelism, null on one rank.
  Communicator* const tp_group = communicator_ != nullptr && communicator_->size() > 1 ? communicator_ : nullptr;
  const MoeParams moe{
      .top_k = c.num_experts_per_tok,
      .router_norm = c.norm_topk_prob ? RouterNorm::kRenormalize : RouterNorm::kNone,
      .activation = activation_of(c.hidden_act),
      .router_softcap = static_cast<float>(c.router_logit_softcapping),
      .communicator = tp_group};
  const bool sandwich = c.norm_placement == NormPlacement::kSandwich;

  // x: the residual stream, F32 on every backend. y: the attention and MoE outputs, F32 too (under
  // tensor parallelism a rank's partial sum, summed F32 over the ranks). Neither is ever rounded to
  // the activation dtype: x += y adds the fp32 sums as they are, so tp N equals tp 1 up to fp32
  // summation order. h (a norm's output, the GEMMs' input), qkv and attn are in the activation dtype.
  Tensor x = ops_.empty(DType::kF32, {tokens, c.hidden_size});
  Tensor h = ops_.empty(act, {tokens, c.hidden_size});
  Tensor y = ops_.empty(DType::kF32, {tokens, c.hidden_size});
  Tensor qkv = ops_.empty(act, {tokens, qkv_size});
  Tensor attn = ops_.empty(act, {tokens, q_size});

  // After each sublayer: y, a rank's partial sum under tensor parallelism, summed over the ranks; then
  // x += y, or x += post_norm(y) with sandwich norms (its output h in the activation dtype); then h =
  // next_norm(x), the norm that follows every residual add, fused with the sum and the add where the
  // backend can.
  const int64_t layers = c.num_hidden_layers;

  ops_.embedding(batch.token_ids, weights_.embed_tokens, x);
  if (c.embedding_multiplier_scale != 1.0)
    ops_.scale(x, static_cast<float>(c.embedding_multiplier_scale));
  ops_.rms_norm(x, layers > 0 ? weights_.layers[0].pre_attn_norm : weights_.norm, eps, h);
  for (int64_t i = 0; i < layers; ++i) {
    const LayerWeights& layer = weights_.layers[i];
    const AttentionParams attention{.num_heads = c.num_attention_heads,
                                    .num_kv_heads = c.num_key_value_heads,
                                    .head_dim = c.head_dim,
                                    .softmax_scale = softmax_scale,
                                    .k_scale = layer.attention.k_scale,
                                    .v_scale = layer.attention.v_scale,
                                    .logit_softcap = static_cast<float>(c.attn_logit_softcapping)};

    // h = pre_attn_norm(x), from the step before.
    ops_.linear(h, layer.attention.qkv_proj, qkv);
    ops_.rope_attention(qkv, c.rope_theta, cache.layers[i], cache.dtype, batch, attention, attn);
    ops_.linear(attn, layer.attention.o_proj, y, tp_group);
    ops_.reduce_add_rms_norm(tp_group, y, x, sandwich ? &layer.post_attn_norm : nullptr, layer.pre_moe_norm, eps, h);

    ops_.moe(h, layer.moe, moe, y);
    ops_.reduce_add_rms_norm(tp_group, y, x, sandwich ? &layer.post_moe_norm : nullptr,
                             i + 1 < layers ? weights_.layers[i + 1].pre_attn_norm : weights_.norm, eps, h);
  }
  Tensor logits = ops_.empty(DType::kF32, {batch.logit_rows.dim(0), c.vocab_size});
  ops_.logits(h, batch.logit_rows, weights_.lm_head, logits);
  if (c.output_multiplier_scale != 1.0)
    ops_.scale(logits, static_cast<float>(c.output_multiplier_scale));
  return logits;
}

}  // namespace nibble
