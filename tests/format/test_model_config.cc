// config.json parsing: Mixtral-8x7B's real config, the spellings newer transformers write, and
// every refusal (each must name the field it refuses); the same for Grok-1's configs.
#include <gtest/gtest.h>

#include "format/model_config.h"
#include "format_test_util.h"

namespace nibble {
namespace {

using nlohmann::json;

// mistralai/Mixtral-8x7B-v0.1 config.json as transformers 4.36 wrote it.
json mixtral_8x7b() {
  return json::parse(R"({
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": false,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1e6,
    "router_aux_loss_coef": 0.02,
    "router_jitter_noise": 0.0,
    "sliding_window": null,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": true,
    "vocab_size": 32000,
    "_name_or_path": "mistralai/Mixtral-8x7B-v0.1",
    "pad_token_id": null
  })");
}

ModelConfig parse(const json& config) {
  return parse_model_config(config, "config.json");
}

json with(json config, const std::string& key, json value) {
  config[key] = std::move(value);
  return config;
}

json without(json config, const std::string& key) {
  config.erase(key);
  return config;
}

TEST(ModelConfig, Mixtral8x7B) {
  const ModelConfig c = parse(mixtral_8x7b());
  EXPECT_EQ(c.architecture, Architecture::kMixtral);
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(c.quantization_config.has_value());
}

// transformers v5: `dtype`, `rope_parameters`, null head_dim; optional fields left out.
TEST(ModelConfig, TransformersV5Spellings) {
  json config =
      without(without(without(mixtral_8x7b(), "torch_dtype"), "rope_theta"), "num_key_value_heads");
  config["dtype"] = "float16";
  config["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  config["head_dim"] = nullptr;
  config["eos_token_id"] = {2, 7};
  config["bos_token_id"] = nullptr;
  const ModelConfig c = parse(config);
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 32);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2, 7}));
  EXPECT_FALSE(c.bos_token_id.has_value());
}

TEST(ModelConfig, Defaults) {
  json config = mixtral_8x7b();
  for (const char* key : {"torch_dtype", "rope_theta", "rms_norm_eps", "tie_word_embeddings",
                          "hidden_act", "sliding_window", "bos_token_id", "eos_token_id"})
    config.erase(key);
  const ModelConfig c = parse(config);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfig, Alternatives) {
  EXPECT_EQ(parse(with(mixtral_8x7b(), "torch_dtype", "float32")).dtype, DType::kF32);
  EXPECT_EQ(parse(with(mixtral_8x7b(), "head_dim", 64)).head_dim, 64);
  EXPECT_TRUE(parse(with(mixtral_8x7b(), "tie_word_embeddings", true)).tie_word_embeddings);
  EXPECT_EQ(parse(with(mixtral_8x7b(), "eos_token_id", nullptr)).eos_token_ids.size(), 0u);
  EXPECT_EQ(parse(with(mixtral_8x7b(), "bos_token_id", 0)).bos_token_id, 0);
  // Both spellings present and agreeing is fine; a window as long as the context never applies.
  EXPECT_EQ(parse(with(with(mixtral_8x7b(), "torch_dtype", "float16"), "dtype", "float16")).dtype,
            DType::kF16);
  EXPECT_DOUBLE_EQ(parse(with(mixtral_8x7b(), "rope_parameters",
                              {{"rope_type", "default"}, {"rope_theta", 1e6}}))
                       .rope_theta,
                   1e6);
  EXPECT_DOUBLE_EQ(
      parse(with(mixtral_8x7b(), "rope_scaling", {{"rope_type", "default"}})).rope_theta, 1e6);
  EXPECT_NO_THROW(parse(with(mixtral_8x7b(), "sliding_window", 32768)));
}

TEST(ModelConfig, QuantizationConfigKeptVerbatim) {
  const json quant = json::parse(R"({"quant_method":"fp8","activation_scheme":"static",
      "int4_experts":{"bits":4,"sym":true,"group":"column"},"ignored_layers":["lm_head"]})");
  const ModelConfig c = parse(with(mixtral_8x7b(), "quantization_config", quant));
  ASSERT_TRUE(c.quantization_config.has_value());
  EXPECT_EQ(*c.quantization_config, quant);
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "quantization_config", "fp8")), "\"quantization_config\"",
               "must be an object");
}

TEST(ModelConfig, UnsupportedModelType) {
  EXPECT_EQ(test::error_of([] { parse(with(mixtral_8x7b(), "model_type", "llama")); }),
            "config.json: model_type \"llama\" is not supported (supported: mixtral, grok-1)");
  EXPECT_ERROR(parse(without(mixtral_8x7b(), "model_type")), "config.json",
               "\"model_type\" is missing");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "model_type", 3)), "\"model_type\" must be a string");
  EXPECT_ERROR(parse(json::array()), "config.json: must be a JSON object, got array");
}

TEST(ModelConfig, MissingRequiredFields) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_local_experts", "num_experts_per_tok",
                          "max_position_embeddings"}) {
    SCOPED_TRACE(key);
    EXPECT_ERROR(parse(without(mixtral_8x7b(), key)),
                 "config.json: \"" + std::string(key) + "\" is missing");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, nullptr)),
                 "\"" + std::string(key) + "\" must not be null");
  }
}

TEST(ModelConfig, BadIntegers) {
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "num_local_experts",
                          "num_experts_per_tok", "max_position_embeddings", "head_dim"}) {
    SCOPED_TRACE(key);
    const std::string field = "\"" + std::string(key) + "\" must be a positive integer";
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, 0)), field, "got 0");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, -8)), field, "got -8");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, 8.5)), field, "got 8.5");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, "8")), field, "got \"8\"");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, true)), field, "got true");
    EXPECT_ERROR(parse(with(mixtral_8x7b(), key, json::parse("18446744073709551615"))), field);
  }
}

TEST(ModelConfig, InconsistentShapes) {
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "num_key_value_heads", 5)),
               "\"num_attention_heads\" (32) must be a multiple of \"num_key_value_heads\" (5)");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "num_experts_per_tok", 9)),
               "\"num_experts_per_tok\" (9) exceeds \"num_local_experts\" (8)");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "hidden_size", 4100)), "\"hidden_size\" (4100)",
               "\"head_dim\" is not given");
  EXPECT_EQ(parse(with(with(mixtral_8x7b(), "hidden_size", 4100), "head_dim", 128)).head_dim, 128);
}

TEST(ModelConfig, BadScalars) {
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rms_norm_eps", 0)),
               "\"rms_norm_eps\" must be a positive number");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rms_norm_eps", "1e-5")), "\"rms_norm_eps\"");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_theta", -1.0)),
               "\"rope_theta\" must be a positive number");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "tie_word_embeddings", 1)),
               "\"tie_word_embeddings\" must be true or false");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "eos_token_id", -1)), "\"eos_token_id\"", "got -1");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "eos_token_id", 32000)),
               "\"eos_token_id\" must be a token id in [0, 32000)");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "eos_token_id", {2, "x"})), "\"eos_token_id\"",
               "got \"x\"");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "bos_token_id", 1.0)), "\"bos_token_id\"", "got 1.0");
}

TEST(ModelConfig, Dtypes) {
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "torch_dtype", "int8")),
               "\"torch_dtype\" \"int8\" is not supported (supported: bfloat16, float16, float32)");
  EXPECT_ERROR(parse(with(without(mixtral_8x7b(), "torch_dtype"), "dtype", "float64")),
               "\"dtype\" \"float64\" is not supported");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "dtype", "float16")),
               "\"torch_dtype\" \"bfloat16\" and \"dtype\" \"float16\" disagree");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "torch_dtype", 16)), "\"torch_dtype\" must be a string");
}

TEST(ModelConfig, UnsupportedFeatures) {
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "hidden_act", "gelu")),
               "config.json: \"hidden_act\" \"gelu\" is not supported (supported: silu)");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "sliding_window", 4096)),
               "\"sliding_window\" is not supported");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_scaling", {{"type", "linear"}, {"factor", 2.0}})),
               "\"rope_scaling.type\" \"linear\" is not supported");
  EXPECT_ERROR(
      parse(with(mixtral_8x7b(), "rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}})),
      "\"rope_scaling.rope_type\" \"yarn\" is not supported");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_scaling", {{"factor", 4.0}})),
               "\"rope_scaling.factor\" is not supported");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_scaling", 2)),
               "\"rope_scaling\" must be an object");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_parameters",
                          {{"rope_type", "llama3"}, {"rope_theta", 5e5}})),
               "\"rope_parameters.rope_type\" \"llama3\" is not supported");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_parameters",
                          {{"rope_type", "default"}, {"rope_theta", 5e5}})),
               "\"rope_theta\" (1e+06) and \"rope_parameters.rope_theta\" (500000) disagree");
  EXPECT_ERROR(parse(with(mixtral_8x7b(), "rope_parameters",
                          {{"rope_type", "default"}, {"rope_theta", "x"}})),
               "\"rope_parameters.rope_theta\" must be a positive number");
}

// hpcai-tech/grok-1 config.json (its Grok1Config, transformers 4.35): num_experts, no head_dim,
// no rope_theta, hpcai-tech's names for the attention multiplier and soft-cap.
json grok1_hpcai() {
  return json::parse(R"({
    "architectures": ["Grok1ModelForCausalLM"],
    "vocab_size": 131072,
    "hidden_size": 6144,
    "intermediate_size": 32768,
    "num_hidden_layers": 64,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "attn_output_multiplier": 0.08838834764831845,
    "embedding_multiplier_scale": 78.38367176906169,
    "output_multiplier_scale": 0.5773502691896257,
    "max_attn_value": 30.0,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "use_cache": true,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": true,
    "num_experts_per_tok": 2,
    "num_experts": 8,
    "output_router_logits": false,
    "router_aux_loss_coef": 0.001,
    "model_type": "grok-1",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0"
  })");
}

// The config SGLang's own Grok-1 examples write: a Grok-1 class with model_type "mixtral".
json grok1_sglang() {
  return json::parse(R"({
    "architectures": ["Grok1ModelForCausalLM"],
    "embedding_multiplier_scale": 78.38367176906169,
    "output_multiplier_scale": 0.5773502691896257,
    "vocab_size": 131072,
    "hidden_size": 6144,
    "intermediate_size": 32768,
    "max_position_embeddings": 8192,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "num_attention_heads": 48,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "model_type": "mixtral",
    "torch_dtype": "bfloat16"
  })");
}

TEST(ModelConfig, Grok1Hpcai) {
  const ModelConfig c = parse(grok1_hpcai());
  EXPECT_EQ(c.architecture, Architecture::kGrok1);
  EXPECT_EQ(c.model_type, "grok-1");
  EXPECT_EQ(c.vocab_size, 131072);
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.intermediate_size, 32768);
  EXPECT_EQ(c.num_hidden_layers, 64);
  EXPECT_EQ(c.num_attention_heads, 48);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e4);  // model.py's RoPE base; the config leaves it out
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_EQ(c.hidden_act, HiddenAct::kGeluTanh);
  EXPECT_EQ(c.norm_placement, NormPlacement::kSandwich);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier_scale, 78.38367176906169);
  EXPECT_DOUBLE_EQ(c.output_multiplier_scale, 0.5773502691896257);
  ASSERT_TRUE(c.attn_output_multiplier.has_value());
  EXPECT_DOUBLE_EQ(*c.attn_output_multiplier, 0.08838834764831845);
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.router_logit_softcapping, 0.0);
}

TEST(ModelConfig, Grok1SglangSpelling) {
  const ModelConfig c = parse(grok1_sglang());
  EXPECT_EQ(c.architecture, Architecture::kGrok1);
  EXPECT_EQ(c.model_type, "mixtral");
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attn_output_multiplier.has_value());  // the forward pass uses 1 / sqrt(head_dim)
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 30.0);
  EXPECT_EQ(c.hidden_act, HiddenAct::kGeluTanh);
  EXPECT_EQ(
      parse(with(grok1_sglang(), "architectures", json::array({"Grok1ForCausalLM"}))).architecture,
      Architecture::kGrok1);
}

TEST(ModelConfig, MixtralLeavesGrokFieldsAtTheirDefaults) {
  const ModelConfig c = parse(mixtral_8x7b());
  EXPECT_EQ(c.hidden_act, HiddenAct::kSilu);
  EXPECT_EQ(c.norm_placement, NormPlacement::kPre);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.embedding_multiplier_scale, 1.0);
  EXPECT_DOUBLE_EQ(c.output_multiplier_scale, 1.0);
  EXPECT_FALSE(c.attn_output_multiplier.has_value());
  EXPECT_DOUBLE_EQ(c.attn_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(c.router_logit_softcapping, 0.0);
}

TEST(ModelConfig, Grok1Alternatives) {
  EXPECT_EQ(parse(with(grok1_hpcai(), "hidden_act", "gelu")).hidden_act, HiddenAct::kGelu);
  EXPECT_EQ(parse(with(grok1_hpcai(), "hidden_act", "gelu_pytorch_tanh")).hidden_act,
            HiddenAct::kGeluTanh);
  EXPECT_EQ(parse(with(grok1_hpcai(), "hidden_act", "gelu_new")).hidden_act, HiddenAct::kGeluTanh);
  EXPECT_DOUBLE_EQ(parse(with(grok1_hpcai(), "max_attn_value", 0)).attn_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(
      parse(with(grok1_sglang(), "attn_logit_softcapping", 50.0)).attn_logit_softcapping, 50.0);
  EXPECT_DOUBLE_EQ(parse(with(grok1_hpcai(), "attn_logit_softcapping", 30)).attn_logit_softcapping,
                   30.0);
  EXPECT_DOUBLE_EQ(
      parse(with(grok1_hpcai(), "router_logit_softcapping", 30.0)).router_logit_softcapping, 30.0);
  EXPECT_TRUE(parse(with(grok1_hpcai(), "norm_topk_prob", true)).norm_topk_prob);
  EXPECT_EQ(parse(with(grok1_hpcai(), "num_local_experts", 8)).num_local_experts, 8);
  EXPECT_DOUBLE_EQ(parse(with(grok1_hpcai(), "rope_theta", 5e5)).rope_theta, 5e5);
  EXPECT_NO_THROW(parse(with(grok1_sglang(), "attn_temperature_len", -1)));
  EXPECT_NO_THROW(parse(with(grok1_sglang(), "residual_moe", false)));
  EXPECT_NO_THROW(parse(with(grok1_sglang(), "final_logit_softcapping", nullptr)));
}

TEST(ModelConfig, Grok1Refusals) {
  for (const char* key : {"embedding_multiplier_scale", "output_multiplier_scale"}) {
    SCOPED_TRACE(key);
    EXPECT_ERROR(parse(without(grok1_hpcai(), key)), "\"" + std::string(key) + "\" is missing");
    EXPECT_ERROR(parse(with(grok1_hpcai(), key, 0)),
                 "\"" + std::string(key) + "\" must be a positive number");
  }
  EXPECT_ERROR(parse(without(grok1_hpcai(), "num_experts")),
               "config.json: \"num_local_experts\" (or \"num_experts\") is missing");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "num_local_experts", 4)),
               "\"num_local_experts\" and \"num_experts\" disagree");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "num_experts_per_tok", 9)),
               "\"num_experts_per_tok\" (9) exceeds \"num_experts\" (8)");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "attn_logit_softcapping", 50.0)),
               "\"max_attn_value\" (30) and \"attn_logit_softcapping\" (50) disagree");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "max_attn_value", -1)),
               "\"max_attn_value\" must be a non-negative number");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "router_logit_softcapping", "30")),
               "\"router_logit_softcapping\" must be a non-negative number");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "attn_output_multiplier", 0)),
               "\"attn_output_multiplier\" must be a positive number");
  EXPECT_ERROR(
      parse(with(grok1_hpcai(), "hidden_act", "silu")),
      "\"hidden_act\" \"silu\" is not supported (supported: gelu_pytorch_tanh, gelu_new, gelu)");
  EXPECT_ERROR(parse(with(grok1_sglang(), "residual_moe", true)),
               "\"residual_moe\" is not supported");
  EXPECT_ERROR(parse(with(grok1_sglang(), "final_logit_softcapping", 50.0)),
               "\"final_logit_softcapping\" is not supported");
  EXPECT_ERROR(parse(with(grok1_sglang(), "attn_temperature_len", 1024)),
               "\"attn_temperature_len\" is not supported");
  EXPECT_ERROR(parse(with(grok1_sglang(), "rope_type", "yarn")), "\"rope_type\" is not supported");
  EXPECT_ERROR(parse(with(grok1_sglang(), "architectures", "Grok1ModelForCausalLM")),
               "\"architectures\" must be a list of strings");
  EXPECT_ERROR(parse(with(grok1_hpcai(), "sliding_window", 4096)),
               "\"sliding_window\" is not supported");
}

TEST(ModelConfig, LoadFromDirectory) {
  test::TempDir dir;
  EXPECT_EQ(test::error_of([&] { load_model_config(dir.path()); }),
            (dir / "config.json").string() + " not found");
  test::write_file(dir / "config.json", mixtral_8x7b().dump(2));
  EXPECT_EQ(load_model_config(dir.path()).hidden_size, 4096);
  test::write_file(dir / "config.json", "{\"model_type\": \"mixtral\",\n  oops}");
  EXPECT_ERROR(load_model_config(dir.path()), (dir / "config.json").string() + ": not valid JSON");
  test::write_file(dir / "config.json", R"({"model_type": "mixtral"})");
  EXPECT_ERROR(load_model_config(dir.path()),
               (dir / "config.json").string() + ": \"vocab_size\" is missing");
}

}  // namespace
}  // namespace nibble
