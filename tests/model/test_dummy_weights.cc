// Dummy weights: the same ModelWeights structure the checkpoint loader builds (every tensor's dtype
// and shape, for each scheme and architecture), weights whose dequantized values have the
// documented distributions (read back through the INT4 and FP8 decoders of src/quant and src/core),
// and reproducibility from the seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/cpu_ops.h"
#include "model/dummy_weights.h"
#include "model/loader.h"
#include "quant/int4.h"

namespace nibble {
namespace {

constexpr Quantization kSchemes[] = {Quantization::kNone, Quantization::kFp8,
                                     Quantization::kQuarkInt4Fp8Moe};

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined() || !b.defined()) return;
  EXPECT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.shape(), b.shape()) << what << ": " << shape_str(a.shape()) << " vs "
                                  << shape_str(b.shape());
}

void expect_same_linear(const Linear& a, const Linear& b, const std::string& what) {
  EXPECT_EQ(a.format, b.format) << what;
  EXPECT_EQ(a.out_features, b.out_features) << what;
  EXPECT_EQ(a.in_features, b.in_features) << what;
  EXPECT_EQ(a.input_scale, b.input_scale) << what;
  expect_same_tensor(a.weight, b.weight, what + ".weight");
  expect_same_tensor(a.scale, b.scale, what + ".scale");
}

void expect_same_structure(const ModelWeights& a, const ModelWeights& b) {
  expect_same_tensor(a.embed_tokens, b.embed_tokens, "embed_tokens");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    const std::string p = "layer " + std::to_string(i) + " ";
    expect_same_tensor(x.pre_attn_norm, y.pre_attn_norm, p + "pre_attn_norm");
    expect_same_tensor(x.post_attn_norm, y.post_attn_norm, p + "post_attn_norm");
    expect_same_tensor(x.pre_moe_norm, y.pre_moe_norm, p + "pre_moe_norm");
    expect_same_tensor(x.post_moe_norm, y.post_moe_norm, p + "post_moe_norm");
    expect_same_linear(x.attention.qkv_proj, y.attention.qkv_proj, p + "qkv_proj");
    expect_same_linear(x.attention.o_proj, y.attention.o_proj, p + "o_proj");
    EXPECT_EQ(x.attention.k_scale, y.attention.k_scale);
    EXPECT_EQ(x.attention.v_scale, y.attention.v_scale);
    expect_same_tensor(x.moe.router, y.moe.router, p + "router");
    const Experts &e = x.moe.experts, &f = y.moe.experts;
    EXPECT_EQ(e.format, f.format) << p;
    EXPECT_EQ(e.num_experts, f.num_experts);
    EXPECT_EQ(e.hidden_size, f.hidden_size);
    EXPECT_EQ(e.intermediate_size, f.intermediate_size);
    expect_same_tensor(e.gate_up, f.gate_up, p + "gate_up");
    expect_same_tensor(e.gate_up_scale, f.gate_up_scale, p + "gate_up_scale");
    expect_same_tensor(e.down, f.down, p + "down");
    expect_same_tensor(e.down_scale, f.down_scale, p + "down_scale");
  }
  expect_same_tensor(a.norm, b.norm, "norm");
  expect_same_linear(a.lm_head, b.lm_head, "lm_head");
}

TEST(DummyWeights, SameStructureAsTheLoader) {
  for (const char* dir : {"tests/fixtures/tiny-mixtral", "tests/fixtures/tiny-grok1"}) {
    const ModelConfig config = load_model_config(dir);
    const Checkpoint checkpoint = Checkpoint::open(dir);
    for (Quantization q : kSchemes) {
      SCOPED_TRACE(std::string(dir) + " " + quantization_name(q));
      CpuOps ops;
      expect_same_structure(load_weights(checkpoint, config, q, ops),
                            dummy_weights(config, q, ops));
    }
  }
}

// A config large enough for the statistics: 1 layer, H 256, I 512, 4 experts, vocab 1024.
ModelConfig stats_config() {
  ModelConfig c = load_model_config("tests/fixtures/tiny-mixtral");
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 1024;
  return c;
}

struct Stats {
  double mean = 0.0, std = 0.0;
};

Stats stats(const std::vector<float>& v) {
  double sum = 0.0, sq = 0.0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return {.mean = mean, .std = std::sqrt(sq / static_cast<double>(v.size()))};
}

// Dequantized values of a (rows, cols) weight in `format` with per-row `scale`.
std::vector<float> dequantize(WeightFormat format, const Tensor& w, const Tensor& scale,
                              int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  const Tensor flat = w.reshape({rows, -1});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      float v = 0.0f;
      if (format == WeightFormat::kBf16) v = bf16_to_float(flat.data<Bf16>()[r * cols + k]);
      if (format == WeightFormat::kFp8)
        v = fp8_e4m3_to_float(flat.data<uint8_t>()[r * cols + k]) * scale.data<float>()[r];
      if (format == WeightFormat::kInt4)
        v = static_cast<float>(int4_at(flat.data<int32_t>() + r * (cols / 8), k)) *
            scale.data<float>()[r];
      out[r * cols + k] = v;
    }
  return out;
}

void expect_weight_like(const std::vector<float>& v, const std::string& what) {
  const Stats s = stats(v);
  EXPECT_NEAR(s.mean, 0.0, 0.002) << what;
  EXPECT_NEAR(s.std, kDummyStd, 0.1 * kDummyStd) << what;
}

TEST(DummyWeights, DistributionsOfEveryScheme) {
  const ModelConfig c = stats_config();
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts;
  for (Quantization q : kSchemes) {
    SCOPED_TRACE(quantization_name(q));
    CpuOps ops;
    const ModelWeights w = dummy_weights(c, q, ops);
    const Experts& ex = w.layers[0].moe.experts;
    expect_weight_like(
        dequantize(ex.format, ex.gate_up, ex.gate_up_scale.reshape({-1}), E * 2 * I, H), "gate_up");
    expect_weight_like(dequantize(ex.format, ex.down, ex.down_scale.reshape({-1}), E * H, I),
                       "down");
    const Linear& qkv = w.layers[0].attention.qkv_proj;
    expect_weight_like(dequantize(qkv.format, qkv.weight, qkv.scale, qkv.out_features, H),
                       "qkv_proj");
    expect_weight_like(dequantize(WeightFormat::kBf16, w.embed_tokens, {}, c.vocab_size, H),
                       "embed_tokens");
    expect_weight_like(dequantize(WeightFormat::kBf16, w.lm_head.weight, {}, c.vocab_size, H),
                       "lm_head");
    const Stats norm = stats(dequantize(WeightFormat::kBf16, w.layers[0].pre_attn_norm, {}, 1, H));
    EXPECT_NEAR(norm.mean, 1.0, 0.02);
    EXPECT_NEAR(norm.std, 0.05, 0.015);
    if (ex.format == WeightFormat::kInt4) {  // codes within ±7, the extremes present but rare
      const Tensor codes = unpack_int4(ex.gate_up.reshape({E * 2 * I, H / 8}));
      int64_t extremes = 0;
      for (int64_t i = 0; i < codes.numel(); ++i) {
        const int8_t v = codes.data<int8_t>()[i];
        ASSERT_TRUE(v >= -7 && v <= 7) << int{v};
        extremes += v == 7 || v == -7;
      }
      EXPECT_GT(extremes, 0);
      EXPECT_LT(extremes, codes.numel() / 1000);
    }
    if (ex.format == WeightFormat::kFp8) {  // no NaN codes, the full ±448 range used
      const auto* codes = ex.gate_up.data<uint8_t>();
      float amax = 0.0f;
      for (int64_t i = 0; i < ex.gate_up.numel(); ++i) {
        ASSERT_NE(codes[i] & 0x7F, 0x7F);
        amax = std::max(amax, std::abs(fp8_e4m3_to_float(codes[i])));
      }
      EXPECT_EQ(amax, kFp8E4M3Max);
    }
  }
}

TEST(DummyWeights, ReproducibleFromTheSeed) {
  const ModelConfig c = stats_config();
  CpuOps ops;
  const auto bytes = [](const Tensor& t) {
    return std::string(static_cast<const char*>(t.raw()), t.nbytes());
  };
  const ModelWeights a = dummy_weights(c, Quantization::kQuarkInt4Fp8Moe, ops, {}, 7);
  const ModelWeights b = dummy_weights(c, Quantization::kQuarkInt4Fp8Moe, ops, {}, 7);
  const ModelWeights other = dummy_weights(c, Quantization::kQuarkInt4Fp8Moe, ops, {}, 8);
  EXPECT_EQ(bytes(a.layers[0].moe.experts.gate_up), bytes(b.layers[0].moe.experts.gate_up));
  EXPECT_EQ(bytes(a.lm_head.weight), bytes(b.lm_head.weight));
  EXPECT_NE(bytes(a.layers[0].moe.experts.gate_up), bytes(other.layers[0].moe.experts.gate_up));
  // Distinct tensors get distinct streams.
  EXPECT_NE(bytes(a.embed_tokens), bytes(a.lm_head.weight));
}

TEST(DummyWeights, ProgressPerLayer) {
  const ModelConfig c = load_model_config("tests/fixtures/tiny-grok1");
  CpuOps ops;
  std::vector<int64_t> seen;
  int64_t last_bytes = 0;
  dummy_weights(c, Quantization::kNone, ops, [&](int64_t done, int64_t total, int64_t bytes) {
    EXPECT_EQ(total, c.num_hidden_layers);
    EXPECT_GT(bytes, last_bytes);
    last_bytes = bytes;
    seen.push_back(done);
  });
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace nibble
