// Norm names per architecture and the CPU row-stacking of fused weights.
#include "model/weight_layout.h"

#include <algorithm>
#include <cstring>

namespace nibble {

NormNames norm_names(Architecture architecture) {
  switch (architecture) {
    case Architecture::kMixtral:
      return {.pre_attn = "input_layernorm",
              .post_attn = nullptr,
              .pre_moe = "post_attention_layernorm",
              .post_moe = nullptr};
    case Architecture::kGrok1:
      return {.pre_attn = "pre_attn_norm",
              .post_attn = "post_attn_norm",
              .pre_moe = "pre_moe_norm",
              .post_moe = "post_moe_norm"};
  }
  fail("unreachable architecture");
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.dim(0);
  Shape shape = parts.at(0).shape();
  shape[0] = rows;
  Tensor out = Tensor::zeros(parts[0].dtype(), shape);
  auto* dst = static_cast<std::byte*>(out.raw());
  for (const Tensor& p : parts) {
    check(p.dtype() == out.dtype() && p.rank() == out.rank() &&
              p.nbytes() / std::max<int64_t>(1, p.dim(0)) ==
                  out.nbytes() / std::max<int64_t>(1, rows),
          "concat_rows: mismatched parts");
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

Tensor filled(int64_t n, float value) {
  Tensor t = Tensor::zeros(DType::kF32, {n});
  std::fill_n(t.data<float>(), n, value);
  return t;
}

void ExpertStack::add(const Quantized& w1, const Quantized& w3, const Quantized& w2) {
  gate_up_.push_back(concat_rows({w1.weight, w3.weight}));
  down_.push_back(w2.weight);
  if (format_ != WeightFormat::kBf16) {
    gate_up_scale_.push_back(concat_rows({w1.scale, w3.scale}));
    down_scale_.push_back(w2.scale);
  }
}

Experts ExpertStack::stack() const {
  const auto E = static_cast<int64_t>(gate_up_.size());
  const int64_t H = hidden_size_, I = intermediate_size_;
  Experts ex{.format = format_, .num_experts = E, .hidden_size = H, .intermediate_size = I,
             .gate_up = concat_rows(gate_up_).reshape({E, 2 * I, -1}),
             .gate_up_scale = {},
             .down = concat_rows(down_).reshape({E, H, -1}),
             .down_scale = {}};
  if (format_ != WeightFormat::kBf16) {
    ex.gate_up_scale = concat_rows(gate_up_scale_).reshape({E, 2 * I});
    ex.down_scale = concat_rows(down_scale_).reshape({E, H});
  }
  return ex;
}

}  // namespace nibble
