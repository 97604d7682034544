// config.json -> ModelConfig: the architecture hyper-parameters nibble needs, with Hugging Face
// names. Unknown architectures and fields whose values nibble cannot honour fail with a message
// naming them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace nibble {

enum class Architecture : uint8_t { kMixtral };

struct ModelConfig {
  Architecture architecture = Architecture::kMixtral;
  std::string model_type;  // as written in config.json
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // per expert
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1e6;
  bool tie_word_embeddings = false;
  DType dtype = DType::kBF16;  // `torch_dtype` or `dtype`
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;                 // an int or a list in config.json
  std::optional<nlohmann::json> quantization_config;  // kept verbatim for the quantization loader
};

// Parses a config.json object; `source` names it in errors.
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads DIR/config.json.
ModelConfig load_model_config(const std::filesystem::path& model_dir);

}  // namespace nibble
