// The weights of a MoE transformer as the forward pass consumes them, in one of three formats.
// Fused at load time: q/k/v into one projection, each expert's w1 (gate) and w3 (up) into gate_up.
// Every quantized weight carries a per-output-row fp32 scale: W[o, k] ≈ q[o, k] × scale[o]
// (an FP8 per-tensor scale is repeated over the rows), so one epilogue serves INT4 and FP8 alike.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace nibble {

enum class WeightFormat : uint8_t {
  kBf16,  // BF16 (out, in)
  kFp8,   // F8_E4M3 (out, in), activations quantized to FP8
  kInt4,  // I32 (out, in / 8) reorder-packed, activations quantized to FP8 per token
};

const char* weight_format_name(WeightFormat format);

// y = x · Wᵀ, for x (tokens, in).
struct Linear {
  WeightFormat format = WeightFormat::kBf16;
  int64_t out_features = 0;
  int64_t in_features = 0;
  Tensor weight;  // see WeightFormat
  Tensor scale;   // F32 (out); undefined for kBf16
  // Static per-tensor FP8 activation scale from a calibrated checkpoint; 0 = dynamic per token.
  float input_scale = 0.0f;
};

// All experts of one layer, stacked. E experts, hidden size H, expert intermediate size I.
struct Experts {
  WeightFormat format = WeightFormat::kBf16;
  int64_t num_experts = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  Tensor gate_up;        // (E, 2I, H) or (E, 2I, H/8) for kInt4; rows [0, I) gate (w1), [I, 2I) up (w3)
  Tensor gate_up_scale;  // F32 (E, 2I)
  Tensor down;           // (E, H, I) or (E, H, I/8) for kInt4 (w2)
  Tensor down_scale;     // F32 (E, H)
};

struct AttentionWeights {
  Linear qkv_proj;  // out = (num_heads + 2 · num_kv_heads) · head_dim
  Linear o_proj;
  float k_scale = 1.0f;  // FP8 KV cache scales: stored = fp8(k / k_scale)
  float v_scale = 1.0f;
};

struct MoeWeights {
  Tensor router;  // BF16 (E, H)
  Experts experts;
};

// Mixtral's input_layernorm and post_attention_layernorm are pre_attn_norm and pre_moe_norm here;
// the post norms (on each sublayer's output) exist only with NormPlacement::kSandwich (Grok-1).
struct LayerWeights {
  Tensor pre_attn_norm;   // BF16 (H)
  Tensor post_attn_norm;  // BF16 (H) or undefined
  Tensor pre_moe_norm;    // BF16 (H)
  Tensor post_moe_norm;   // BF16 (H) or undefined
  AttentionWeights attention;
  MoeWeights moe;
};

struct ModelWeights {
  Tensor embed_tokens;  // BF16 (V, H)
  std::vector<LayerWeights> layers;
  Tensor norm;  // BF16 (H)
  Linear lm_head;  // BF16 (V, H)
};

}  // namespace nibble
