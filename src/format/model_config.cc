// config.json -> ModelConfig for the architectures nibble runs (Mixtral, Grok-1). Fields nibble
// reads are type- and range-checked; fields that would change the numerics in a way nibble does not
// implement (sliding windows, RoPE scaling, other activations) are refused; the rest are ignored.
#include "format/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "format/json_brief.h"
#include "format/quote.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSupportedModelTypes = "mixtral, grok-1";

// Reads the fields of one JSON object; every error names the source file and the field's path.
class Fields {
 public:
  Fields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  // The value of `key`, or nullptr when it is absent or null (config.json writes null for "unset").
  const json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  [[noreturn]] void fail_field(const char* key, const std::string& problem) const {
    fail(source_, ": \"", prefix_, key, "\" ", problem);
  }

  int64_t positive_int(const char* key) const {
    const json* value = find(key);
    if (value == nullptr)
      fail_field(key, object_.contains(key) ? "must not be null" : "is missing");
    return positive_int(key, *value);
  }

  int64_t positive_int(const char* key, const json& value) const {
    const bool fits = value.is_number_integer() &&
                      (!value.is_number_unsigned() || value.get<uint64_t>() <= INT64_MAX);
    if (!fits || value.get<int64_t>() <= 0)
      fail_field(key, cat("must be a positive integer, got ", json_brief(value)));
    return value.get<int64_t>();
  }

  int64_t positive_int_or(const char* key, int64_t fallback) const {
    return find(key) ? positive_int(key) : fallback;
  }

  double positive_number_or(const char* key, double fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() <= 0)
      fail_field(key, cat("must be a positive number, got ", json_brief(*value)));
    return value->get<double>();
  }

  double positive_number(const char* key) const {
    if (find(key) == nullptr)
      fail_field(key, object_.contains(key) ? "must not be null" : "is missing");
    return positive_number_or(key, 0.0);
  }

  double non_negative_number_or(const char* key, double fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number() || !std::isfinite(value->get<double>()) || value->get<double>() < 0)
      fail_field(key, cat("must be a non-negative number, got ", json_brief(*value)));
    return value->get<double>();
  }

  std::optional<std::string> string(const char* key) const {
    const json* value = find(key);
    if (value == nullptr) return std::nullopt;
    if (!value->is_string()) fail_field(key, cat("must be a string, got ", json_brief(*value)));
    return value->get<std::string>();
  }

  bool boolean_or(const char* key, bool fallback) const {
    const json* value = find(key);
    if (value == nullptr) return fallback;
    if (!value->is_boolean()) fail_field(key, cat("must be true or false, got ", json_brief(*value)));
    return value->get<bool>();
  }

  int64_t token_id(const char* key, const json& value, int64_t vocab_size) const {
    // Parsed JSON holds non-negative integers as unsigned, but a json built in code may not.
    const bool ok = value.is_number_unsigned()
                        ? value.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                        : value.is_number_integer() && value.get<int64_t>() >= 0 &&
                              value.get<int64_t>() < vocab_size;
    if (!ok)
      fail_field(key, cat("must be a token id in [0, ", vocab_size, "), got ", json_brief(value)));
    return value.get<int64_t>();
  }

  const std::string& source() const { return source_; }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

DType parse_dtype(const Fields& fields) {
  const auto torch_dtype = fields.string("torch_dtype");
  const auto dtype = fields.string("dtype");  // transformers v5 renamed torch_dtype to dtype
  if (torch_dtype && dtype && *torch_dtype != *dtype)
    fail(fields.source(), ": \"torch_dtype\" ", quote_text(*torch_dtype), " and \"dtype\" ",
         quote_text(*dtype), " disagree");
  const std::string name = dtype ? *dtype : torch_dtype.value_or("bfloat16");
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  if (name == "float32") return DType::kF32;
  fields.fail_field(
      dtype ? "dtype" : "torch_dtype",
      cat(quote_text(name), " is not supported (supported: bfloat16, float16, float32)"));
}

// rope_parameters (transformers v5) or rope_scaling (v4): only plain RoPE is implemented, and
// either may carry rope_theta. Returns the theta it carries, if any.
std::optional<double> parse_rope_block(const Fields& fields, const char* key) {
  const json* block = fields.find(key);
  if (block == nullptr) return std::nullopt;
  if (!block->is_object()) fields.fail_field(key, cat("must be an object, got ", json_brief(*block)));
  const Fields inner(*block, fields.source(), cat(key, "."));
  const char* type_key = block->contains("rope_type") ? "rope_type" : "type";
  const std::string type = inner.string(type_key).value_or("default");
  if (type != "default")
    inner.fail_field(type_key, cat(quote_text(type), " is not supported (only default RoPE)"));
  for (const auto& [name, value] : block->items())
    if (name != "rope_type" && name != "type" && name != "rope_theta")
      inner.fail_field(name.c_str(), "is not supported");
  if (!inner.find("rope_theta")) return std::nullopt;
  return inner.positive_number_or("rope_theta", 0.0);
}

double parse_rope_theta(const Fields& fields, double fallback) {
  const auto top = fields.find("rope_theta")
                       ? std::optional(fields.positive_number_or("rope_theta", 0))
                       : std::nullopt;
  const auto from_parameters = parse_rope_block(fields, "rope_parameters");
  const auto from_scaling = parse_rope_block(fields, "rope_scaling");
  const auto nested = from_parameters ? from_parameters : from_scaling;
  if (top && nested && *top != *nested)
    fail(fields.source(), ": \"rope_theta\" (", *top, ") and \"rope_parameters.rope_theta\" (",
         *nested, ") disagree");
  return top ? *top : nested.value_or(fallback);
}

void parse_token_ids(const Fields& fields, ModelConfig& config) {
  if (const json* bos = fields.find("bos_token_id"))
    config.bos_token_id = fields.token_id("bos_token_id", *bos, config.vocab_size);
  if (const json* eos = fields.find("eos_token_id")) {
    if (eos->is_array()) {
      for (const auto& id : *eos)
        config.eos_token_ids.push_back(fields.token_id("eos_token_id", id, config.vocab_size));
    } else {
      config.eos_token_ids.push_back(fields.token_id("eos_token_id", *eos, config.vocab_size));
    }
  }
}

// `hidden_act`: one of the names in `supported` (see kActivations), or `fallback` when absent.
HiddenAct parse_hidden_act(const Fields& fields, const std::vector<std::string>& supported,
                           HiddenAct fallback) {
  struct Named {
    const char* name;
    HiddenAct act;
  };
  // transformers' names: "gelu" is the exact (erf) GELU; the other two are its tanh approximation.
  static constexpr Named kActivations[] = {{"silu", HiddenAct::kSilu},
                                           {"gelu", HiddenAct::kGelu},
                                           {"gelu_pytorch_tanh", HiddenAct::kGeluTanh},
                                           {"gelu_new", HiddenAct::kGeluTanh}};
  const auto name = fields.string("hidden_act");
  if (!name) return fallback;
  const bool allowed = std::find(supported.begin(), supported.end(), *name) != supported.end();
  for (const Named& a : kActivations)
    if (allowed && *name == a.name) return a.act;
  std::string list;
  for (const std::string& s : supported) list += (list.empty() ? "" : ", ") + s;
  fields.fail_field("hidden_act",
                    cat(quote_text(*name), " is not supported (supported: ", list, ")"));
}

void check_sliding_window(const Fields& fields, const ModelConfig& config) {
  // A window at least as long as the context never takes effect, so it is harmless.
  if (fields.find("sliding_window") &&
      fields.positive_int("sliding_window") < config.max_position_embeddings)
    fields.fail_field("sliding_window",
                      "is not supported (sliding-window attention); it must be null");
}

// The shapes and the fields every architecture reads. `experts_key` names the expert count.
ModelConfig parse_common(const Fields& fields, const char* experts_key, double default_rope_theta) {
  ModelConfig config;
  config.vocab_size = fields.positive_int("vocab_size");
  config.hidden_size = fields.positive_int("hidden_size");
  config.intermediate_size = fields.positive_int("intermediate_size");
  config.num_hidden_layers = fields.positive_int("num_hidden_layers");
  config.num_attention_heads = fields.positive_int("num_attention_heads");
  config.num_key_value_heads =
      fields.positive_int_or("num_key_value_heads", config.num_attention_heads);
  config.num_local_experts = fields.positive_int(experts_key);
  config.num_experts_per_tok = fields.positive_int("num_experts_per_tok");
  config.max_position_embeddings = fields.positive_int("max_position_embeddings");

  const std::string& source = fields.source();
  check(config.num_attention_heads % config.num_key_value_heads == 0, source,
        ": \"num_attention_heads\" (", config.num_attention_heads,
        ") must be a multiple of \"num_key_value_heads\" (", config.num_key_value_heads, ")");
  check(config.num_experts_per_tok <= config.num_local_experts, source,
        ": \"num_experts_per_tok\" (", config.num_experts_per_tok, ") exceeds \"", experts_key,
        "\" (", config.num_local_experts, ")");
  if (fields.find("head_dim")) {
    config.head_dim = fields.positive_int("head_dim");
  } else {
    check(config.hidden_size % config.num_attention_heads == 0, source, ": \"hidden_size\" (",
          config.hidden_size, ") is not a multiple of \"num_attention_heads\" (",
          config.num_attention_heads, ") and \"head_dim\" is not given");
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }

  config.rms_norm_eps = fields.positive_number_or("rms_norm_eps", 1e-5);
  config.rope_theta = parse_rope_theta(fields, default_rope_theta);
  config.tie_word_embeddings = fields.boolean_or("tie_word_embeddings", false);
  config.dtype = parse_dtype(fields);
  parse_token_ids(fields, config);
  if (const json* quantization = fields.find("quantization_config")) {
    if (!quantization->is_object())
      fields.fail_field("quantization_config",
                        cat("must be an object, got ", json_brief(*quantization)));
    config.quantization_config = *quantization;
  }
  check_sliding_window(fields, config);
  return config;
}

ModelConfig parse_mixtral(const Fields& fields) {
  // 1e6 is transformers' MixtralConfig default rope_theta.
  ModelConfig config = parse_common(fields, "num_local_experts", 1e6);
  config.architecture = Architecture::kMixtral;
  config.hidden_act = parse_hidden_act(fields, {"silu"}, HiddenAct::kSilu);
  return config;
}

// hpcai-tech's Grok1Config says num_experts, SGLang's configs num_local_experts.
const char* grok1_experts_key(const Fields& fields) {
  const bool local = fields.find("num_local_experts"), plain = fields.find("num_experts");
  if (local && plain &&
      fields.positive_int("num_local_experts") != fields.positive_int("num_experts"))
    fail(fields.source(), ": \"num_local_experts\" and \"num_experts\" disagree");
  if (!local && !plain)
    fail(fields.source(), ": \"num_local_experts\" (or \"num_experts\") is missing");
  return local ? "num_local_experts" : "num_experts";
}

// Grok-1 as xai-org/grok-1's model.py computes it (README.md, "Grok-1", says why each default).
ModelConfig parse_grok1(const Fields& fields) {
  ModelConfig config = parse_common(fields, grok1_experts_key(fields), 1e4);  // model.py: base 1e4
  config.architecture = Architecture::kGrok1;
  config.hidden_act =
      parse_hidden_act(fields, {"gelu_pytorch_tanh", "gelu_new", "gelu"}, HiddenAct::kGeluTanh);
  config.norm_placement = NormPlacement::kSandwich;
  config.norm_topk_prob = fields.boolean_or("norm_topk_prob", false);
  config.embedding_multiplier_scale = fields.positive_number("embedding_multiplier_scale");
  config.output_multiplier_scale = fields.positive_number("output_multiplier_scale");
  if (fields.find("attn_output_multiplier"))
    config.attn_output_multiplier = fields.positive_number("attn_output_multiplier");
  // hpcai-tech's name, then SGLang's; model.py hard-codes 30.
  const double max_attn_value = fields.non_negative_number_or("max_attn_value", 30.0);
  const double softcap = fields.non_negative_number_or("attn_logit_softcapping", max_attn_value);
  if (fields.find("max_attn_value") && softcap != max_attn_value)
    fail(fields.source(), ": \"max_attn_value\" (", max_attn_value,
         ") and \"attn_logit_softcapping\" (", softcap, ") disagree");
  config.attn_logit_softcapping = softcap;
  config.router_logit_softcapping = fields.non_negative_number_or("router_logit_softcapping", 0.0);

  // Grok-2's additions to the same model class, which nibble does not implement.
  if (fields.boolean_or("residual_moe", false))
    fields.fail_field("residual_moe", "is not supported (a dense MLP beside the experts)");
  if (fields.non_negative_number_or("final_logit_softcapping", 0.0) > 0)
    fields.fail_field("final_logit_softcapping", "is not supported");
  const json* temperature_len = fields.find("attn_temperature_len");  // SGLang: -1 = off
  if (temperature_len && !(temperature_len->is_number() && temperature_len->get<double>() <= 0))
    fields.fail_field("attn_temperature_len", "is not supported");
  if (fields.find("rope_type"))
    fields.fail_field("rope_type", "is not supported (only default RoPE)");
  return config;
}

// SGLang picks the model by its class in `architectures`, and its example Grok-1 configs pair
// Grok1ModelForCausalLM with model_type "mixtral"; a Grok-1 class therefore wins over model_type.
bool names_grok1_class(const Fields& fields) {
  const json* classes = fields.find("architectures");
  if (classes == nullptr) return false;
  if (!classes->is_array())
    fields.fail_field("architectures", cat("must be a list of strings, got ", json_brief(*classes)));
  for (const json& name : *classes) {
    if (!name.is_string())
      fields.fail_field("architectures", cat("must be a list of strings, got ", json_brief(*classes)));
    if (name == "Grok1ModelForCausalLM" || name == "Grok1ForCausalLM") return true;
  }
  return false;
}

}  // namespace

ModelConfig parse_model_config(const json& config, const std::string& source) {
  check(config.is_object(), source, ": must be a JSON object, got ", config.type_name());
  const Fields fields(config, source);
  try {
    const auto model_type = fields.string("model_type");
    check(model_type.has_value(), source,
          ": \"model_type\" is missing (supported: ", kSupportedModelTypes, ")");
    if (*model_type == "grok-1" || names_grok1_class(fields)) {
      ModelConfig config = parse_grok1(fields);
      config.model_type = *model_type;
      return config;
    }
    if (*model_type == "mixtral") {
      ModelConfig config = parse_mixtral(fields);
      config.model_type = *model_type;
      return config;
    }
    fail(source, ": model_type ", quote_text(*model_type),
         " is not supported (supported: ", kSupportedModelTypes, ")");
  } catch (const json::exception& e) {  // a type nibble did not anticipate: still one clean line
    fail(source, ": ", printable(e.what()));
  }
}

ModelConfig load_model_config(const fs::path& model_dir) {
  const fs::path path = model_dir / "config.json";
  const std::string source = path.string();
  std::error_code error;
  check(fs::is_regular_file(path, error), source, " not found");
  std::ifstream in(path, std::ios::binary);
  check(in.good(), source, ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  json config;
  try {
    config = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(source, ": not valid JSON: ", printable(e.what()));
  }
  return parse_model_config(config, source);
}

}  // namespace nibble
