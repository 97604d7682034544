// The `quantization_config` block of a pre-quantized checkpoint as AMD Quark exports it (DESIGN.md
// §2): quant_method "fp8", INT4 experts when `int4_experts` is present (FP8 experts otherwise),
// static or dynamic activation and KV-cache scales, `export.pack_method` "reorder",
// `ignored_layers` kept BF16. Parsed strictly (a field nibble cannot honour fails, naming it);
// `nibble quantize` writes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/weights.h"

namespace nibble {

enum class ScaleScheme : uint8_t {
  kStatic,
  kDynamic
};  // calibrated scales in the checkpoint, or none
// How the checkpoint's FP8 bytes are encoded: OCP e4m3fn, or ROCm's e4m3fnuz (bias 8, max 240),
// which the loader converts (same bits, half the value: the tensor's scale is halved; 0x80 becomes
// 0).
enum class Fp8Encoding : uint8_t { kE4M3Fn, kE4M3FnUz };

struct QuarkConfig {
  WeightFormat expert_format = WeightFormat::kInt4;  // kInt4 (int4_experts) or kFp8
  ScaleScheme activation_scheme = ScaleScheme::kDynamic;
  ScaleScheme kv_cache_scheme = ScaleScheme::kDynamic;
  Fp8Encoding fp8_encoding = Fp8Encoding::kE4M3Fn;
  // Layer names (a tensor's name without ".weight") or patterns where `*` matches any run of
  // characters, e.g. "lm_head", "*.gate", "model.layers.0.block_sparse_moe.gate".
  std::vector<std::string> ignored_layers;

  bool is_ignored(const std::string& layer) const;
};

// `block` is config.json's quantization_config; `source` (the file) prefixes every error.
// Recognised fields: quant_method (must be "fp8"), int4_experts {bits 4, sym true, group "column"},
// activation_scheme, kv_cache_scheme ("static", "dynamic", null, or an object with "dynamic"),
// export {pack_method "reorder", weight_format "real_quantized"}, ignored_layers, weight_block_size
// (must be absent or null), fp8_dtype ("float8_e4m3fn" or "float8_e4m3fnuz"). Others are ignored.
QuarkConfig parse_quark_config(const nlohmann::json& block, const std::string& source);

// The block `nibble quantize` writes for a model of `num_hidden_layers` layers: static activation
// and KV-cache scales, reorder packing, routers and lm_head ignored; `int4_experts` when
// expert_format is kInt4.
nlohmann::ordered_json make_quark_config(WeightFormat expert_format, int64_t num_hidden_layers);

// Glob match where `*` matches any run of characters (dots included) and every other character
// itself.
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace nibble
