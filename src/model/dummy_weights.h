// `--load-format dummy`: a model's weights from config.json alone, random but shaped and
// distributed like a trained checkpoint's after nibble's quantization, at full size and directly in
// the final formats (no CPU quantizer runs): the same ModelWeights the loader builds, handed to
// `ops.upload` and `ops.prepare_moe` one layer at a time so host memory holds one layer. For
// benchmarks and memory tests; the model's outputs mean nothing.
//
// Distributions (σ = kDummyStd, HF's initializer_range): BF16 weights N(0, σ²); norms N(1, 0.05²);
// INT4 experts: codes round(1.75·z) clamped to ±7 (a row's max |w| ≈ 4σ maps to 7) with per-row
// scales 4σ/7 × U(0.75, 1.25); FP8 weights: e4m3 codes of z·448/zmax with the per-tensor scale
// σ·zmax/448 × U(0.75, 1.25). z is a standard normal drawn by inverting its CDF at 16-bit uniforms
// from a counter-based splitmix64 stream, so the values do not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

#include "format/model_config.h"
#include "model/loader.h"
#include "model/ops.h"
#include "model/weights.h"

namespace nibble {

inline constexpr float kDummyStd = 0.02f;

// Called after each layer with the layers done, the total, and the bytes of weights made so far.
using DummyProgress = std::function<void(int64_t done, int64_t total, int64_t bytes)>;

// `quantization` must be resolved (not kAuto).
ModelWeights dummy_weights(const ModelConfig& config, Quantization quantization, Ops& ops,
                           const DummyProgress& progress = {}, uint64_t seed = 0);

}  // namespace nibble
