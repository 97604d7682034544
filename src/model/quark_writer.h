// Writes a pre-quantized checkpoint in the Quark W4A8KV8 format (DESIGN.md §2) from a bf16/fp16
// checkpoint and its calibration: INT4 (or FP8) experts and FP8 attention projections quantized by
// src/quant (the same codes and scales online quantization computes), static input and KV-cache
// scales from the calibration, everything else copied, config.json given a quantization_config, and
// tokenizer and other small files copied. The directory appears complete or not at all.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "model/calibration.h"
#include "model/weights.h"

namespace nibble {

struct QuarkWriteOptions {
  WeightFormat expert_format = WeightFormat::kInt4;  // kInt4 (quark_int4fp8_moe) or kFp8 (fp8)
  int64_t max_shard_bytes = 5'000'000'000;           // a shard closes before it would pass this
};

struct QuarkWriteSummary {
  int64_t tensors = 0;  // written
  int64_t shards = 0;
  int64_t bytes = 0;  // of tensor data
};

// Called after each source tensor with (done, total).
using WriteProgress = std::function<void(int64_t done, int64_t total)>;

// `output_dir` must not exist or be an empty directory.
QuarkWriteSummary write_quark_checkpoint(const std::filesystem::path& model_dir,
                                         const std::filesystem::path& output_dir,
                                         const Calibration& calibration,
                                         const QuarkWriteOptions& options,
                                         const WriteProgress& progress = {});

// The per-tensor FP8 scale written beside an INT4 weight whose row scales are `row_scale`: the
// power of two at or above max(row_scale) × 7 / 448 (the FP8 scale of the tensor's amax). A power
// of two makes weight_scale1 = row_scale / weight_scale exact, so a loader's product gives back
// row_scale bit for bit.
float int4_tensor_scale(const Tensor& row_scale);

}  // namespace nibble
