// Loads a checkpoint's weights into ModelWeights on a backend, quantizing online when asked:
//   none               everything BF16 (F16/F32 checkpoints are converted)
//   fp8                W8A8: attention projections and experts FP8 per tensor, dynamic per-token activations
//   quark_int4fp8_moe  W4A8: experts INT4 per output channel, attention projections FP8 per tensor
// Routers, norms, embeddings and lm_head stay BF16 in every scheme.
// A pre-quantized checkpoint (quantization_config in config.json) loads as it is (quark_loader.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "format/model_config.h"
#include "format/safetensors.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

enum class Quantization : uint8_t { kAuto, kNone, kFp8, kQuarkInt4Fp8Moe };

std::optional<Quantization> quantization_from_name(std::string_view name);
const char* quantization_name(Quantization q);

// `auto` resolved against the checkpoint: its quantization_config, else none.
Quantization resolve_quantization(Quantization requested, const ModelConfig& config);

// Progress is reported through `progress` (may be empty): called with (done, total) tensors.
using LoadProgress = void (*)(int64_t done, int64_t total);

ModelWeights load_weights(const Checkpoint& checkpoint, const ModelConfig& config,
                          Quantization quantization, Ops& ops, LoadProgress progress = nullptr);

}  // namespace nibble
