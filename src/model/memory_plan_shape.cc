// config.json -> ModelShape for the memory plan. Mixtral and Grok-1 go through parse_model_config
// (the configs nibble runs, with all its checks); qwen3_moe and deepseek_v3 are read from their own
// fields (Hugging Face's Qwen3MoeConfig and DeepseekV3Config names) for planning only.
#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "model/memory_plan.h"

namespace nibble {
namespace {

using nlohmann::json;

// Positive integer fields of a raw config; errors name the file and the field.
class RawFields {
 public:
  RawFields(const json& config, const std::string& source) : config_(config), source_(source) {}

  int64_t get(const char* key) const {
    const auto it = config_.find(key);
    check(it != config_.end() && !it->is_null(), source_, ": \"", key, "\" is missing");
    check(it->is_number_integer() && it->get<int64_t>() > 0, source_, ": \"", key,
          "\" must be a positive integer");
    return it->get<int64_t>();
  }
  int64_t get_or(const char* key, int64_t fallback) const {
    const auto it = config_.find(key);
    return it == config_.end() || it->is_null() ? fallback : get(key);
  }
  int64_t non_negative_or(const char* key, int64_t fallback) const {
    const auto it = config_.find(key);
    if (it == config_.end() || it->is_null()) return fallback;
    check(it->is_number_integer() && it->get<int64_t>() >= 0, source_, ": \"", key,
          "\" must be a non-negative integer");
    return it->get<int64_t>();
  }
  bool flag_or(const char* key, bool fallback) const {
    const auto it = config_.find(key);
    return it != config_.end() && it->is_boolean() ? it->get<bool>() : fallback;
  }

 private:
  const json& config_;
  const std::string& source_;
};

void common_fields(const RawFields& f, const json& config, ModelShape& s) {
  s.vocab_size = f.get("vocab_size");
  s.hidden_size = f.get("hidden_size");
  s.num_hidden_layers = f.get("num_hidden_layers");
  s.num_attention_heads = f.get("num_attention_heads");
  s.num_key_value_heads = f.get_or("num_key_value_heads", s.num_attention_heads);
  s.num_experts_per_tok = f.get("num_experts_per_tok");
  s.tie_word_embeddings = f.flag_or("tie_word_embeddings", false);
  if (config.contains("quantization_config") && config["quantization_config"].is_object())
    s.quantization_config = config["quantization_config"];
}

// Qwen3-MoE: layer i has experts unless listed in mlp_only_layers, every decoder_sparse_step-th
// layer.
ModelShape qwen3_moe_shape(const json& config, const std::string& source) {
  const RawFields f(config, source);
  ModelShape s{.model_type = "qwen3_moe"};
  common_fields(f, config, s);
  s.head_dim = f.get_or("head_dim", s.hidden_size / s.num_attention_heads);
  s.qk_norm = true;
  s.num_experts = f.get("num_experts");
  s.moe_intermediate_size = f.get("moe_intermediate_size");
  const int64_t step = f.get_or("decoder_sparse_step", 1);
  std::vector<int64_t> mlp_only;
  if (config.contains("mlp_only_layers") && config["mlp_only_layers"].is_array())
    for (const json& i : config["mlp_only_layers"])
      if (i.is_number_integer()) mlp_only.push_back(i.get<int64_t>());
  for (int64_t i = 0; i < s.num_hidden_layers; ++i) {
    const bool dense =
        std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end() || (i + 1) % step != 0;
    (dense ? s.num_dense_layers : s.num_moe_layers) += 1;
  }
  if (s.num_dense_layers > 0) s.dense_intermediate_size = f.get("intermediate_size");
  return s;
}

// DeepSeek-V3: MLA attention; the first first_k_dense_replace layers (and those off moe_layer_freq)
// have a dense MLP; the others routed experts plus n_shared_experts shared ones. The multi-token
// prediction layers (num_nextn_predict_layers) serve speculative decoding only and are not counted.
ModelShape deepseek_v3_shape(const json& config, const std::string& source) {
  const RawFields f(config, source);
  ModelShape s{.model_type = "deepseek_v3"};
  common_fields(f, config, s);
  s.attention = AttentionKind::kMla;
  s.q_lora_rank = f.non_negative_or("q_lora_rank", 0);
  s.kv_lora_rank = f.get("kv_lora_rank");
  s.qk_nope_head_dim = f.get("qk_nope_head_dim");
  s.qk_rope_head_dim = f.get("qk_rope_head_dim");
  s.v_head_dim = f.get("v_head_dim");
  s.head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;
  s.num_experts = f.get("n_routed_experts");
  s.moe_intermediate_size = f.get("moe_intermediate_size");
  s.shared_expert_intermediate_size =
      f.non_negative_or("n_shared_experts", 0) * s.moe_intermediate_size;
  s.router_bias = true;
  const int64_t first_dense = f.non_negative_or("first_k_dense_replace", 0);
  const int64_t freq = f.get_or("moe_layer_freq", 1);
  for (int64_t i = 0; i < s.num_hidden_layers; ++i)
    (i >= first_dense && i % freq == 0 ? s.num_moe_layers : s.num_dense_layers) += 1;
  if (s.num_dense_layers > 0) s.dense_intermediate_size = f.get("intermediate_size");
  return s;
}

}  // namespace

ModelShape model_shape(const ModelConfig& c) {
  return {.model_type = c.model_type,
          .vocab_size = c.vocab_size,
          .hidden_size = c.hidden_size,
          .num_hidden_layers = c.num_hidden_layers,
          .tie_word_embeddings = c.tie_word_embeddings,
          .norms_per_layer = c.norm_placement == NormPlacement::kSandwich ? 4 : 2,
          .num_attention_heads = c.num_attention_heads,
          .num_key_value_heads = c.num_key_value_heads,
          .head_dim = c.head_dim,
          .num_moe_layers = c.num_hidden_layers,
          .num_experts = c.num_local_experts,
          .num_experts_per_tok = c.num_experts_per_tok,
          .moe_intermediate_size = c.intermediate_size,
          .quantization_config = c.quantization_config};
}

ModelShape model_shape_from_json(const nlohmann::json& config, const std::string& source) {
  check(config.is_object(), source, ": not a JSON object");
  const auto type = config.find("model_type");
  const std::string model_type =
      type != config.end() && type->is_string() ? type->get<std::string>() : "";
  if (model_type == "qwen3_moe") return qwen3_moe_shape(config, source);
  if (model_type == "deepseek_v3") return deepseek_v3_shape(config, source);
  return model_shape(parse_model_config(config, source));  // mixtral, grok-1, or its clear refusal
}

ModelShape load_model_shape(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  std::ifstream in(path);
  check(in.good(), path.string(), " does not exist or cannot be read");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
  return model_shape_from_json(config, path.string());
}

}  // namespace nibble
