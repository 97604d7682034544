// Calibration of the static scales a W4A8KV8 checkpoint carries: a bf16 model runs a text sample
// through a backend wrapped in an Ops that records, per layer, the largest magnitude (amax)
// entering the qkv and o projections and written to the K and V caches. model.cc is unaware of it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "format/model_config.h"
#include "format/safetensors.h"
#include "model/ops.h"

namespace nibble {

struct LayerCalibration {
  float qkv_input_amax = 0.0f;  // the normed hidden states entering q/k/v_proj
  float o_input_amax = 0.0f;    // the attention output entering o_proj
  float k_amax = 0.0f;          // keys as the cache stores them (after RoPE)
  float v_amax = 0.0f;
};

struct Calibration {
  std::vector<LayerCalibration> layers;
  int64_t num_sequences = 0;
  int64_t num_tokens = 0;
};

// Called after each sequence with (done, total).
using CalibrationProgress = std::function<void(int64_t done, int64_t total)>;

// Loads the checkpoint's weights in bf16 (it must not be pre-quantized) on `backend` and runs each
// sequence through the model as one prefill, with a BF16 KV cache. Sequences must be non-empty and
// no longer than max_position_embeddings.
Calibration calibrate(const Checkpoint& checkpoint, const ModelConfig& config, Ops& backend,
                      const std::vector<std::vector<int32_t>>& sequences,
                      const CalibrationProgress& progress = {});

// The built-in sample: short passages of prose, dialogue, instructions, code and numbers (about
// 700 words), for `nibble quantize`.
std::span<const std::string_view> calibration_texts();

// Static FP8 scale of a calibrated amax: max(amax, 1e-12) / 448, as a dynamic scale would be.
float static_fp8_scale(float amax);

}  // namespace nibble
