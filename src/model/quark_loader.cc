// Pre-quantized (Quark W4A8KV8 / FP8) checkpoint -> ModelWeights, laid out exactly as loader.cc
// lays out online quantization's result (same fusing, same per-row scales), plus the static scales.
#include "model/quark_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "model/quark_config.h"
#include "model/weight_layout.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

// A CPU copy with its own (aligned) memory: a tensor in a mapped shard may sit at any byte offset.
Tensor owned_copy(const Tensor& t) {
  Tensor out = Tensor::zeros(t.dtype(), t.shape());
  if (t.nbytes() > 0) std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

struct QuarkReader {
  const Checkpoint& checkpoint;
  const QuarkConfig& quark;
  Ops& ops;
  LoadProgress progress;
  int64_t done = 0;
  int64_t total = 0;

  std::string tensor(const std::string& name) const {
    return cat(checkpoint.dir().string(), ": tensor \"", name, "\"");
  }

  // The tensor `name`, checked to have one of `dtypes` and `shape`; `why` ends the dtype error.
  Tensor get(const std::string& name, std::initializer_list<DType> dtypes, const char* expected,
             const Shape& shape, const std::string& why) const {
    const Tensor t = checkpoint.get(name);
    check(std::find(dtypes.begin(), dtypes.end(), t.dtype()) != dtypes.end(), tensor(name),
          " has dtype ", dtype_name(t.dtype()), ", expected ", expected, why);
    check(t.shape() == shape, tensor(name), " has shape ", shape_str(t.shape()), ", expected ",
          shape_str(shape));
    return t;
  }

  // A BF16/F16/F32 weight as BF16 on the CPU, as the online loader reads it.
  Tensor bf16_host(const std::string& name, const Shape& shape, const std::string& why = "") {
    Tensor t = get(name, {DType::kBF16, DType::kF16, DType::kF32}, "BF16, F16 or F32", shape, why);
    if (progress) progress(++done, total);
    if (t.dtype() == DType::kBF16) return t;
    const Tensor f = to_f32(t);
    Tensor out = Tensor::zeros(DType::kBF16, shape);
    for (int64_t i = 0; i < f.numel(); ++i) out.data<Bf16>()[i] = float_to_bf16(f.data<float>()[i]);
    return out;
  }

  // Float scales as F32, each checked to be positive and finite.
  Tensor scales(const std::string& name, const Shape& shape) const {
    const Tensor t =
        get(name, {DType::kF32, DType::kBF16, DType::kF16}, "F32, BF16 or F16", shape, "");
    const Tensor f = to_f32(owned_copy(t));
    for (int64_t i = 0; i < f.numel(); ++i) {
      const float v = f.data<float>()[i];
      check(std::isfinite(v) && v > 0.0f, tensor(name), " holds ", v,
            f.numel() > 1 ? cat(" at index ", i) : std::string(),
            "; a scale must be positive and finite");
    }
    return f;
  }

  // A per-tensor scale: shape [] as Quark writes it, or [1].
  float scalar(const std::string& name) const {
    const Shape shape =
        checkpoint.contains(name) && checkpoint.info(name).shape.size() == 1 ? Shape{1} : Shape{};
    return scales(name, shape).data<float>()[0];
  }

  WeightFormat format_of(const std::string& layer, WeightFormat quantized) const {
    return quark.is_ignored(layer) ? WeightFormat::kBf16 : quantized;
  }

  // The weight of `layer` (a name without ".weight"), (rows, cols) in `format`.
  Quantized weight(const std::string& layer, WeightFormat format, int64_t rows, int64_t cols) {
    const std::string name = layer + ".weight";
    const std::string why = format == WeightFormat::kBf16
                                ? "; the layer is in quantization_config.ignored_layers"
                                : "; the layer is not in quantization_config.ignored_layers";
    switch (format) {
      case WeightFormat::kBf16:
        return {.weight = bf16_host(name, {rows, cols}, why), .scale = {}};
      case WeightFormat::kFp8: {
        // e4m3fnuz when quantization_config.fp8_dtype says so or the tensor's own dtype does.
        const Tensor stored = get(name, {DType::kF8E4M3, DType::kF8E4M3FnUz}, "F8_E4M3 or F8_E4M3FNUZ",
                                  {rows, cols}, why);
        Tensor bytes = Tensor::zeros(DType::kF8E4M3, {rows, cols});
        if (bytes.nbytes() > 0) std::memcpy(bytes.raw(), stored.raw(), bytes.nbytes());
        if (progress) progress(++done, total);
        float scale = scalar(layer + ".weight_scale");
        if (quark.fp8_encoding == Fp8Encoding::kE4M3FnUz || stored.dtype() == DType::kF8E4M3FnUz) {
          for (int64_t i = 0; i < bytes.numel(); ++i)
            bytes.data<uint8_t>()[i] = fp8_e4m3fnuz_to_e4m3fn(bytes.data<uint8_t>()[i]);
          scale *= 0.5f;  // the same bits read as e4m3fn are twice the e4m3fnuz value
        }
        return {.weight = bytes, .scale = filled(rows, scale)};
      }
      case WeightFormat::kInt4: {
        check(cols % kInt4PerWord == 0, tensor(name), ": INT4 input size ", cols,
              " is not a multiple of 8");
        Tensor packed = owned_copy(
            get(name, {DType::kI32}, "I32 (packed INT4)", {rows, cols / kInt4PerWord}, why));
        if (progress) progress(++done, total);
        const float scale = scalar(layer + ".weight_scale");
        const std::string name1 = layer + ".weight_scale1";
        Tensor row_scale = scales(name1, {rows});
        for (int64_t o = 0; o < rows; ++o) {
          float& s = row_scale.data<float>()[o];
          s *= scale;  // the INT4 row scale: Quark stores it divided by the FP8 per-tensor scale
          check(std::isfinite(s) && s > 0.0f, tensor(name1), " × weight_scale is ", s, " at index ",
                o, "; a scale must be positive and finite");
        }
        return {.weight = packed, .scale = row_scale};
      }
    }
    fail("unreachable weight format");
  }

  // Several weights with the same input stacked along the output rows, as loader.cc's fused_linear.
  Linear fused(const std::vector<Quantized>& parts, WeightFormat format, int64_t in_features,
               float input_scale) {
    std::vector<Tensor> weights, row_scales;
    for (const Quantized& q : parts) {
      weights.push_back(q.weight);
      if (format != WeightFormat::kBf16) row_scales.push_back(q.scale);
    }
    Linear linear{.format = format,
                  .out_features = 0,
                  .in_features = in_features,
                  .weight = ops.upload(concat_rows(weights)),
                  .scale = {},
                  .input_scale = input_scale};
    linear.out_features = linear.weight.dim(0);
    if (format != WeightFormat::kBf16) linear.scale = ops.upload(concat_rows(row_scales));
    return linear;
  }

  // The FP8 KV-cache scale of `which` ('k' or 'v') under the layer's "model.layers.{i}.self_attn.".
  float kv_scale(const std::string& attn, char which) const {
    const std::string w(1, which);
    const std::vector<std::string> names{
        attn + w + "_proj.output_scale", attn + w + "_proj." + w + "_scale", attn + w + "_scale",
        attn + "attn." + w + "_scale",   attn + w + "_proj.kv_scale",        attn + "kv_scale"};
    for (const std::string& name : names)
      if (checkpoint.contains(name)) return scalar(name);
    std::string others;
    for (std::size_t i = 1; i < names.size(); ++i) others += cat(i > 1 ? ", " : "", names[i]);
    fail(tensor(names[0]),
         " is missing: kv_cache_scheme is static, so each layer needs its KV-cache scales (",
         "also accepted: ", others, ")");
  }
};

}  // namespace

Quantization prequantized_scheme(const ModelConfig& config) {
  check(config.quantization_config.has_value(),
        "prequantized_scheme: the config has no quantization_config");
  const QuarkConfig quark = parse_quark_config(*config.quantization_config, "config.json");
  return quark.expert_format == WeightFormat::kInt4 ? Quantization::kQuarkInt4Fp8Moe
                                                    : Quantization::kFp8;
}

ModelWeights load_quark_weights(const Checkpoint& checkpoint, const ModelConfig& c, Ops& ops,
                                LoadProgress progress, StaticScales static_scales) {
  check(c.quantization_config.has_value(), checkpoint.dir().string(),
        ": config.json has no quantization_config");
  const QuarkConfig quark =
      parse_quark_config(*c.quantization_config, (checkpoint.dir() / "config.json").string());
  const bool static_inputs =
      static_scales == StaticScales::kUse && quark.activation_scheme == ScaleScheme::kStatic;
  const bool static_kv =
      static_scales == StaticScales::kUse && quark.kv_cache_scheme == ScaleScheme::kStatic;
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts, D = c.head_dim;
  const int64_t V = c.vocab_size, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const NormNames norms = norm_names(c.architecture);
  const int64_t layer_norms = 2 + (norms.post_attn ? 1 : 0) + (norms.post_moe ? 1 : 0);
  QuarkReader r{.checkpoint = checkpoint,
                .quark = quark,
                .ops = ops,
                .progress = progress,
                .done = 0,
                .total = 3 + c.num_hidden_layers * (layer_norms + 5 + 3 * E) -
                         (c.tie_word_embeddings ? 1 : 0)};

  ModelWeights w;
  w.embed_tokens = ops.upload(r.bf16_host("model.embed_tokens.weight", {V, H}));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    const auto norm = [&](const char* name) {
      return name ? ops.upload(r.bf16_host(cat(p, name, ".weight"), {H})) : Tensor();
    };
    LayerWeights layer;
    layer.pre_attn_norm = norm(norms.pre_attn);
    layer.post_attn_norm = norm(norms.post_attn);
    layer.pre_moe_norm = norm(norms.pre_moe);
    layer.post_moe_norm = norm(norms.post_moe);

    const std::string a = p + "self_attn.";
    const WeightFormat qkv_format = r.format_of(a + "q_proj", WeightFormat::kFp8);
    check(r.format_of(a + "k_proj", WeightFormat::kFp8) == qkv_format &&
              r.format_of(a + "v_proj", WeightFormat::kFp8) == qkv_format,
          checkpoint.dir().string(), ": ", a,
          "q_proj, k_proj and v_proj are fused into one projection: list all "
          "three or none of them in quantization_config.ignored_layers");
    std::vector<Quantized> qkv{r.weight(a + "q_proj", qkv_format, Hq * D, H),
                               r.weight(a + "k_proj", qkv_format, Hkv * D, H),
                               r.weight(a + "v_proj", qkv_format, Hkv * D, H)};
    // q, k and v read the same activations but Quark calibrates one input scale each; the fused
    // projection quantizes its input once, so it takes the largest: no value any of the three was
    // calibrated to represent saturates, at the cost of a little resolution for the other two.
    float qkv_input_scale = 0.0f;
    if (static_inputs && qkv_format != WeightFormat::kBf16)
      for (const char* name : {"q_proj", "k_proj", "v_proj"})
        qkv_input_scale = std::max(qkv_input_scale, r.scalar(cat(a, name, ".input_scale")));
    layer.attention.qkv_proj = r.fused(qkv, qkv_format, H, qkv_input_scale);

    const WeightFormat o_format = r.format_of(a + "o_proj", WeightFormat::kFp8);
    const Quantized o = r.weight(a + "o_proj", o_format, H, Hq * D);
    const float o_input_scale = static_inputs && o_format != WeightFormat::kBf16
                                    ? r.scalar(a + "o_proj.input_scale")
                                    : 0.0f;
    layer.attention.o_proj = r.fused({o}, o_format, Hq * D, o_input_scale);
    if (static_kv) {
      layer.attention.k_scale = r.kv_scale(a, 'k');
      layer.attention.v_scale = r.kv_scale(a, 'v');
    }

    // Experts: INT4 or FP8 as the config says, all of a layer in one format. Their input scales, if
    // any, are not read: nibble quantizes expert activations per token (DESIGN.md §2).
    const std::string m = p + "block_sparse_moe.";
    MoeWeights moe{.router = r.bf16_host(m + "gate.weight", {E, H}), .experts = {}};
    const std::string first = m + "experts.0.w1";
    const WeightFormat expert_format = r.format_of(first, quark.expert_format);
    ExpertStack experts(expert_format, H, I);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = cat(m, "experts.", e, ".");
      for (const char* name : {"w1", "w3", "w2"})
        check(r.format_of(x + name, quark.expert_format) == expert_format,
              checkpoint.dir().string(), ": ", x, name,
              quark.is_ignored(x + name) ? " is" : " is not",
              " in quantization_config.ignored_layers, unlike ", first,
              ": the experts of one layer must share one format");
      const Quantized w1 = r.weight(x + "w1", expert_format, I, H);
      const Quantized w3 = r.weight(x + "w3", expert_format, I, H);
      const Quantized w2 = r.weight(x + "w2", expert_format, H, I);
      experts.add(w1, w3, w2);
    }
    moe.experts = experts.stack();
    layer.moe = ops.prepare_moe(moe);
    w.layers.push_back(std::move(layer));
  }
  w.norm = ops.upload(r.bf16_host("model.norm.weight", {H}));
  const Tensor lm_head =
      c.tie_word_embeddings ? ops.download(w.embed_tokens) : r.bf16_host("lm_head.weight", {V, H});
  w.lm_head = r.fused({{.weight = lm_head, .scale = {}}}, WeightFormat::kBf16, H, 0.0f);
  return w;
}

}  // namespace nibble
