// Loads a pre-quantized checkpoint (`quantization_config` as AMD Quark exports W4A8KV8, DESIGN.md
// §2) into exactly the ModelWeights online quantization builds: INT4 experts from int32
// reorder-packed w1/w2/w3 with effective row scales weight_scale1 × weight_scale, FP8 attention
// projections with their per-tensor scales, plus what only a calibrated checkpoint has: static
// input scales on the FP8 linears and KV-cache scales. Every malformed scale or weight fails naming
// its tensor.
#pragma once

#include "format/model_config.h"
#include "format/safetensors.h"
#include "model/loader.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

// kIgnore drops the calibrated static scales (input scales 0 = dynamic per token, KV scales 1): the
// weights are then exactly online quantization's, which the round-trip tests compare against.
enum class StaticScales : uint8_t { kUse, kIgnore };

// The scheme a pre-quantized checkpoint's config implies: kQuarkInt4Fp8Moe with int4_experts, kFp8
// without. Fails on a quantization_config nibble cannot load, naming the field.
Quantization prequantized_scheme(const ModelConfig& config);

// `config.quantization_config` must be set.
ModelWeights load_quark_weights(const Checkpoint& checkpoint, const ModelConfig& config, Ops& ops,
                                LoadProgress progress = nullptr,
                                StaticScales static_scales = StaticScales::kUse);

}  // namespace nibble
