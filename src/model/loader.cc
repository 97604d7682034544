// Checkpoint -> ModelWeights for the Mixtral and Grok-1 tensor names, with online quantization.
// The architectures share every name but those of their layers' norms (norm_names).
#include "model/loader.h"

#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "model/quark_loader.h"
#include "model/weight_layout.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

struct Reader {
  const Checkpoint& checkpoint;
  Ops& ops;
  LoadProgress progress;
  int64_t done = 0;
  int64_t total = 0;

  // The tensor `name`, checked to be a float tensor of `shape`, on the CPU.
  Tensor get(const std::string& name, const Shape& shape) {
    const Tensor t = checkpoint.get(name);
    check(t.dtype() == DType::kBF16 || t.dtype() == DType::kF16 || t.dtype() == DType::kF32,
          checkpoint.dir().string(), ": tensor \"", name, "\" has dtype ", dtype_name(t.dtype()),
          ", expected BF16, F16 or F32");
    check(t.shape() == shape, checkpoint.dir().string(), ": tensor \"", name, "\" has shape ",
          shape_str(t.shape()), ", expected ", shape_str(shape));
    if (progress) progress(++done, total);
    return t;
  }

  // The tensor as BF16, on the CPU.
  Tensor bf16_host(const std::string& name, const Shape& shape) {
    Tensor t = get(name, shape);
    if (t.dtype() != DType::kBF16) {
      const Tensor f = to_f32(t);
      t = Tensor::zeros(DType::kBF16, shape);
      for (int64_t i = 0; i < f.numel(); ++i) t.data<Bf16>()[i] = float_to_bf16(f.data<float>()[i]);
    }
    return t;
  }

  Tensor bf16(const std::string& name, const Shape& shape) { return ops.upload(bf16_host(name, shape)); }
};

Quantized quantize(const Tensor& w, WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16: {
      Tensor out = Tensor::zeros(DType::kBF16, w.shape());
      const Tensor f = to_f32(w);
      for (int64_t i = 0; i < f.numel(); ++i) out.data<Bf16>()[i] = float_to_bf16(f.data<float>()[i]);
      return {.weight = out, .scale = {}};
    }
    case WeightFormat::kFp8: {
      Fp8Weight q = quantize_fp8_per_tensor(w);
      return {.weight = q.weight, .scale = filled(w.dim(0), q.scale)};
    }
    case WeightFormat::kInt4: {
      Int4Weight q = quantize_int4(w);
      return {.weight = q.packed, .scale = q.scale};
    }
  }
  fail("unreachable weight format");
}

// Several weights with the same input, quantized one by one and stacked along the output rows.
Linear fused_linear(const std::vector<Tensor>& parts, WeightFormat format, Ops& ops) {
  std::vector<Tensor> weights, scales;
  for (const Tensor& p : parts) {
    Quantized q = quantize(p, format);
    weights.push_back(q.weight);
    if (format != WeightFormat::kBf16) scales.push_back(q.scale);
  }
  Linear linear{.format = format,
                .out_features = 0,
                .in_features = parts[0].dim(1),
                .weight = ops.upload(concat_rows(weights)),
                .scale = {},
                .input_scale = 0.0f};
  linear.out_features = linear.weight.dim(0);
  if (format != WeightFormat::kBf16) linear.scale = ops.upload(concat_rows(scales));
  return linear;
}

}  // namespace

std::optional<Quantization> quantization_from_name(std::string_view name) {
  if (name == "auto") return Quantization::kAuto;
  if (name == "none") return Quantization::kNone;
  if (name == "fp8") return Quantization::kFp8;
  if (name == "quark_int4fp8_moe") return Quantization::kQuarkInt4Fp8Moe;
  return std::nullopt;
}

const char* quantization_name(Quantization q) {
  switch (q) {
    case Quantization::kAuto: return "auto";
    case Quantization::kNone: return "none";
    case Quantization::kFp8: return "fp8";
    case Quantization::kQuarkInt4Fp8Moe: return "quark_int4fp8_moe";
  }
  return "?";
}

Quantization resolve_quantization(Quantization requested, const ModelConfig& config) {
  if (config.quantization_config) {  // pre-quantized: its own scheme, whatever else is asked
    const Quantization scheme = prequantized_scheme(config);
    check(requested == Quantization::kAuto || requested == scheme,
          "this checkpoint is pre-quantized as ", quantization_name(scheme),
          " (quantization_config in config.json); --quantization ", quantization_name(requested),
          " cannot be applied to it: use auto");
    return scheme;
  }
  return requested == Quantization::kAuto ? Quantization::kNone : requested;
}

ModelWeights load_weights(const Checkpoint& checkpoint, const ModelConfig& c,
                          Quantization quantization, Ops& ops, LoadProgress progress) {
  quantization = resolve_quantization(quantization, c);
  if (c.quantization_config) return load_quark_weights(checkpoint, c, ops, progress);
  const WeightFormat attention_format =
      quantization == Quantization::kNone ? WeightFormat::kBf16 : WeightFormat::kFp8;
  const WeightFormat expert_format = quantization == Quantization::kQuarkInt4Fp8Moe ? WeightFormat::kInt4
                                     : quantization == Quantization::kFp8             ? WeightFormat::kFp8
                                                                                      : WeightFormat::kBf16;
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts, D = c.head_dim;
  const int64_t V = c.vocab_size;
  const NormNames norms = norm_names(c.architecture);
  const int64_t layer_norms = 2 + (norms.post_attn ? 1 : 0) + (norms.post_moe ? 1 : 0);
  Reader r{.checkpoint = checkpoint, .ops = ops, .progress = progress, .done = 0,
           .total = 3 + c.num_hidden_layers * (layer_norms + 5 + 3 * E) - (c.tie_word_embeddings ? 1 : 0)};

  ModelWeights w;
  w.embed_tokens = r.bf16("model.embed_tokens.weight", {V, H});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    const auto norm = [&](const char* name) {
      return name ? r.bf16(cat(p, name, ".weight"), {H}) : Tensor();
    };
    LayerWeights layer;
    layer.pre_attn_norm = norm(norms.pre_attn);
    layer.post_attn_norm = norm(norms.post_attn);
    layer.pre_moe_norm = norm(norms.pre_moe);
    layer.post_moe_norm = norm(norms.post_moe);
    const std::string a = p + "self_attn.";
    layer.attention.qkv_proj =
        fused_linear({r.get(a + "q_proj.weight", {c.num_attention_heads * D, H}),
                      r.get(a + "k_proj.weight", {c.num_key_value_heads * D, H}),
                      r.get(a + "v_proj.weight", {c.num_key_value_heads * D, H})},
                     attention_format, ops);
    layer.attention.o_proj =
        fused_linear({r.get(a + "o_proj.weight", {H, c.num_attention_heads * D})}, attention_format, ops);

    const std::string m = p + "block_sparse_moe.";
    MoeWeights moe{.router = r.bf16_host(m + "gate.weight", {E, H}), .experts = {}};
    ExpertStack experts(expert_format, H, I);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = cat(m, "experts.", e, ".");
      const Quantized w1 = quantize(r.get(x + "w1.weight", {I, H}), expert_format);
      const Quantized w3 = quantize(r.get(x + "w3.weight", {I, H}), expert_format);
      const Quantized w2 = quantize(r.get(x + "w2.weight", {H, I}), expert_format);
      experts.add(w1, w3, w2);
    }
    moe.experts = experts.stack();
    layer.moe = ops.prepare_moe(moe);
    w.layers.push_back(std::move(layer));
  }
  w.norm = r.bf16("model.norm.weight", {H});
  const Tensor lm_head = c.tie_word_embeddings ? ops.download(w.embed_tokens)
                                               : r.get("lm_head.weight", {V, H});
  w.lm_head = fused_linear({lm_head}, WeightFormat::kBf16, ops);
  return w;
}

}  // namespace nibble
