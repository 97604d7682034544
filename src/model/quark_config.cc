// quantization_config: strict parsing of the Quark/FP8 block, and the block nibble quantize writes.
#include "model/quark_config.h"

#include "core/error.h"
#include "format/json_brief.h"
#include "format/quote.h"

namespace nibble {
namespace {

using nlohmann::json;

// Errors name the file and the field's path under quantization_config.
struct Block {
  const json& object;
  const std::string& source;
  std::string path;  // "quantization_config." or "quantization_config.export."

  const json* find(const char* key) const {
    const auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

  [[noreturn]] void fail_field(const char* key, const std::string& problem) const {
    fail(source, ": \"", path, key, "\" ", problem);
  }

  // The string value of `key` (nullptr when absent or null), failing unless it is one of `allowed`.
  const json* one_of(const char* key, std::initializer_list<const char*> allowed) const {
    const json* value = find(key);
    if (value == nullptr) return nullptr;
    if (value->is_string())
      for (const char* a : allowed)
        if (value->get<std::string>() == a) return value;
    std::string list;
    for (const char* a : allowed) list += cat(list.empty() ? "" : ", ", "\"", a, "\"");
    fail_field(key, cat("is ", json_brief(*value), "; nibble supports ", list));
  }

  ScaleScheme scheme(const char* key) const {
    const json* value = find(key);
    if (value != nullptr &&
        value->is_object()) {  // {"dynamic": false, ...} (compressed-tensors style)
      const auto dynamic = value->find("dynamic");
      if (dynamic == value->end() || !dynamic->is_boolean())
        fail_field(key, cat("is ", json_brief(*value), "; an object needs a boolean \"dynamic\""));
      return dynamic->get<bool>() ? ScaleScheme::kDynamic : ScaleScheme::kStatic;
    }
    value = one_of(key, {"static", "dynamic"});
    return value != nullptr && value->get<std::string>() == "static" ? ScaleScheme::kStatic
                                                                     : ScaleScheme::kDynamic;
  }
};

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) {
  // Greedy match with one backtrack point: the last `*` seen.
  std::size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool QuarkConfig::is_ignored(const std::string& layer) const {
  for (const std::string& pattern : ignored_layers)
    if (glob_match(pattern, layer)) return true;
  return false;
}

QuarkConfig parse_quark_config(const json& block, const std::string& source) {
  check(block.is_object(), source, ": \"quantization_config\" must be an object, got ",
        json_brief(block));
  const Block b{.object = block, .source = source, .path = "quantization_config."};
  QuarkConfig config;

  const json* method = b.find("quant_method");
  if (method == nullptr) b.fail_field("quant_method", "is missing");
  b.one_of("quant_method", {"fp8"});
  if (const json* size = b.find("weight_block_size"))
    b.fail_field("weight_block_size",
                 cat("is ", json_brief(*size), "; block-wise FP8 weights are not supported"));

  config.expert_format = WeightFormat::kFp8;
  if (const json* int4 = b.find("int4_experts")) {
    if (!int4->is_object())
      b.fail_field("int4_experts", cat("must be an object, got ", json_brief(*int4)));
    const Block e{.object = *int4, .source = source, .path = "quantization_config.int4_experts."};
    if (const json* bits = e.find("bits"); bits != nullptr && *bits != 4)
      e.fail_field("bits", cat("is ", json_brief(*bits), "; nibble supports 4"));
    if (const json* sym = e.find("sym"); sym != nullptr && *sym != true)
      e.fail_field("sym", cat("is ", json_brief(*sym), "; nibble supports symmetric INT4 (true)"));
    e.one_of("group", {"column"});
    config.expert_format = WeightFormat::kInt4;
  }
  config.activation_scheme = b.scheme("activation_scheme");
  config.kv_cache_scheme = b.scheme("kv_cache_scheme");

  if (const json* exported = b.find("export")) {
    if (!exported->is_object())
      b.fail_field("export", cat("must be an object, got ", json_brief(*exported)));
    const Block e{.object = *exported, .source = source, .path = "quantization_config.export."};
    e.one_of("pack_method", {"reorder"});
    e.one_of("weight_format", {"real_quantized"});
  }
  if (const json* ignored = b.find("ignored_layers")) {
    if (!ignored->is_array())
      b.fail_field("ignored_layers", cat("must be a list of names, got ", json_brief(*ignored)));
    for (const json& name : *ignored) {
      if (!name.is_string())
        b.fail_field("ignored_layers", cat("holds ", json_brief(name), ", not a name"));
      config.ignored_layers.push_back(name.get<std::string>());
    }
  }
  if (const json* fp8 = b.one_of("fp8_dtype", {"float8_e4m3fn", "float8_e4m3fnuz"}))
    config.fp8_encoding = fp8->get<std::string>() == "float8_e4m3fnuz" ? Fp8Encoding::kE4M3FnUz
                                                                       : Fp8Encoding::kE4M3Fn;
  return config;
}

nlohmann::ordered_json make_quark_config(WeightFormat expert_format, int64_t num_hidden_layers) {
  check(expert_format == WeightFormat::kInt4 || expert_format == WeightFormat::kFp8,
        "make_quark_config: experts must be INT4 or FP8");
  nlohmann::ordered_json ignored = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    ignored.push_back(cat("model.layers.", i, ".block_sparse_moe.gate"));
  ignored.push_back("lm_head");
  nlohmann::ordered_json block;
  block["activation_scheme"] = "static";
  block["export"] = {{"kv_cache_group", {"*k_proj", "*v_proj"}},
                     {"min_kv_scale", 0.0},
                     {"pack_method", "reorder"},
                     {"weight_format", "real_quantized"},
                     {"weight_merge_groups", nullptr}};
  block["ignored_layers"] = ignored;
  if (expert_format == WeightFormat::kInt4)
    block["int4_experts"] = {{"bits", 4}, {"group", "column"}, {"sym", true}};
  block["kv_cache_scheme"] = "static";
  block["quant_method"] = "fp8";
  return block;
}

}  // namespace nibble
