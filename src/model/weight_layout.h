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

// One (rows, cols) weight as the forward pass takes it: codes in its format and per-row scales, on
// the CPU.
struct Quantized {
  Tensor weight;
  Tensor scale;  // F32 (rows); undefined for BF16
};

// One layer's experts, added one at a time as their w1, w3 (I, H) and w2 (H, I) in one format, then
// stacked: gate_up (E, 2I, ·) = [w1; w3] of each expert and down (E, H, ·), with their F32 row scales
// (none for kBf16).
class ExpertStack {
 public:
  ExpertStack(WeightFormat format, int64_t hidden_size, int64_t intermediate_size)
      : format_(format), hidden_size_(hidden_size), intermediate_size_(intermediate_size) {}
  void add(const Quantized& w1, const Quantized& w3, const Quantized& w2);
  Experts stack() const;

 private:
  WeightFormat format_;
  int64_t hidden_size_, intermediate_size_;
  std::vector<Tensor> gate_up_, gate_up_scale_, down_, down_scale_;
};

}  // namespace nibble
