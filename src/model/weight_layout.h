// The checkpoint layout every loader shares (online, pre-quantized): the norm tensor names of each
// architecture, and the row-stacking that fuses q/k/v and w1/w3 on the CPU before upload. One
// definition, so every loader hands the backend byte-identical ModelWeights for the same weights.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "format/model_config.h"
#include "model/weights.h"

namespace nibble {

// The names of a layer's norms under model.layers.{i}.; nullptr where the architecture has none.
struct NormNames {
  const char* pre_attn;
  const char* post_attn;
  const char* pre_moe;
  const char* post_moe;
};

NormNames norm_names(Architecture architecture);

// Stacks CPU tensors of one dtype and equal row size along dimension 0: (Σ rows_i, ...).
Tensor concat_rows(const std::vector<Tensor>& parts);

// F32 (n) filled with `value` (a per-tensor scale repeated over the rows), on the CPU.
Tensor filled(int64_t n, float value);

// One layer's experts stacked from per-expert CPU parts: gate_up (2I, ·) and down (H, ·) in `format`,
// with their F32 row scales (empty lists for kBf16).
Experts stack_experts(WeightFormat format, int64_t hidden_size, int64_t intermediate_size,
                      const std::vector<Tensor>& gate_up, const std::vector<Tensor>& gate_up_scale,
                      const std::vector<Tensor>& down, const std::vector<Tensor>& down_scale);

}  // namespace nibble
