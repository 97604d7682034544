// config.json -> ModelConfig: the architecture hyper-parameters nibble needs, with Hugging Face
// names. Unknown architectures and fields whose values nibble cannot honour fail with a message
// naming them. Architectures differ only in data: the fields below the shapes say how (Mixtral's
// values are the defaults; Grok-1 sets the rest).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace nibble {

enum class Architecture : uint8_t { kMixtral, kGrok1 };

// The expert activation, `hidden_act` in config.json: silu, gelu (exact, erf), gelu_pytorch_tanh.
enum class HiddenAct : uint8_t { kSilu, kGelu, kGeluTanh };

// Where a layer's RMSNorms sit. kPre: one before attention and one before the MoE (Mixtral).
// kSandwich: also one on each sublayer's output before it joins the residual stream (Grok-1).
enum class NormPlacement : uint8_t { kPre, kSandwich };

struct ModelConfig {
  Architecture architecture = Architecture::kMixtral;
  std::string model_type;  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;           // hidden_size / num_attention_heads unless given
  int64_t num_local_experts = 0;  // Grok-1 configs may call it num_experts
  int64_t num_experts_per_tok = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  DType dtype = DType::kBF16;  // `torch_dtype` or `dtype`

  HiddenAct hidden_act = HiddenAct::kSilu;
  NormPlacement norm_placement = NormPlacement::kPre;
  bool norm_topk_prob = true;               // renormalize the top-k routing weights to sum to one
  double embedding_multiplier_scale = 1.0;  // token embeddings are multiplied by this
  double output_multiplier_scale = 1.0;     // and the logits by this
  // The attention softmax scale (Grok's name for it); 1 / sqrt(head_dim) when absent.
  std::optional<double> attn_output_multiplier;
  // Soft caps `cap · tanh(x / cap)`, 0 = none: on the scaled attention logits (Grok-1's
  // max_attn_value) and on the router logits before their softmax.
  double attn_logit_softcapping = 0.0;
  double router_logit_softcapping = 0.0;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;                 // an int or a list in config.json
  std::optional<nlohmann::json> quantization_config;  // kept verbatim for the quantization loader
};

// Parses a config.json object; `source` names it in errors.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads DIR/config.json.
ModelConfig load_model_config(const std::filesystem::path& model_dir);

}  // namespace nibble
