// The quark loader on variants of a written tiny-Mixtral checkpoint: every malformed one (missing,
// misshapen, mistyped or non-positive scales and weights; unsupported config fields) fails with an
// error naming the tensor or field; ignored_layers stay BF16; e4m3fnuz bytes are converted on load;
// the other accepted KV-scale names are read.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "core/fp8.h"
#include "model/quark_config.h"
#include "quark_test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::error_of;
using test::TensorMap;

constexpr char kModel[] = "tests/fixtures/tiny-mixtral";
constexpr char kReference[] = "tests/fixtures/tiny-mixtral-reference.json";

class QuarkLoader : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("quark-loader");
    test::write_quantized(kModel, kReference, dir_->path() / "q", WeightFormat::kInt4);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path quantized() { return dir_->path() / "q"; }

  // The load error of a variant (the empty string if it loads).
  std::string variant_error(const std::function<void(TensorMap&)>& change,
                            const std::function<void(nlohmann::json&)>& change_config = {}) {
    const fs::path path = dir_->path() / cat("variant-", count_++);
    test::write_variant(quantized(), path, change, change_config);
    return error_of([&] { test::load_quark(path); });
  }

  static test::TempDir* dir_;
  static inline int count_ = 0;
};

test::TempDir* QuarkLoader::dir_ = nullptr;

constexpr char kExpert[] = "model.layers.1.block_sparse_moe.experts.2.";
constexpr char kAttention[] = "model.layers.2.self_attn.";

TEST_F(QuarkLoader, TheWrittenCheckpointLoads) {
  EXPECT_EQ(error_of([] { test::load_quark(quantized()); }), "");
}

struct TensorCase {
  const char* what;
  std::string tensor;  // must appear in the error
  const char* detail;  // and this too
  std::function<void(TensorMap&, const std::string&)> change;
};

TEST_F(QuarkLoader, MalformedTensorsAreNamed) {
  const auto erase = [](TensorMap& t, const std::string& name) {
    ASSERT_EQ(t.erase(name), 1u) << name;
  };
  const auto set_first = [](float value) {
    return [value](TensorMap& t, const std::string& name) { t.at(name).data<float>()[0] = value; };
  };
  const std::string e = kExpert, a = kAttention;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<TensorCase> cases{
      {"missing weight_scale1", e + "w3.weight_scale1", "not found", erase},
      {"missing weight_scale", e + "w2.weight_scale", "not found", erase},
      {"missing expert weight", e + "w1.weight", "not found", erase},
      {"missing attention weight_scale", a + "q_proj.weight_scale", "not found", erase},
      {"missing input_scale", a + "o_proj.input_scale", "not found", erase},
      {"missing k scale", a + "k_proj.output_scale", "kv_cache_scheme", erase},
      {"missing v scale", a + "v_proj.output_scale", "kv_cache_scheme", erase},
      {"zero weight_scale", e + "w1.weight_scale", "positive", set_first(0.0f)},
      {"negative weight_scale", a + "o_proj.weight_scale", "positive", set_first(-1.0f)},
      {"NaN weight_scale1", e + "w2.weight_scale1", "positive", set_first(nan)},
      {"infinite input_scale", a + "k_proj.input_scale", "positive", set_first(INFINITY)},
      {"zero KV scale", a + "v_proj.output_scale", "positive", set_first(0.0f)},
      {"NaN KV scale", a + "k_proj.output_scale", "positive", set_first(nan)},
      {"weight_scale1 of the wrong length", e + "w1.weight_scale1", "shape",
       [](TensorMap& t, const std::string& name) { t[name] = Tensor::zeros(DType::kF32, {7}); }},
      {"weight_scale not a scalar", e + "w3.weight_scale", "shape",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kF32, {2, 2});
       }},
      {"weight_scale1 as int", e + "w3.weight_scale1", "dtype",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kI32, t.at(name).shape());
       }},
      {"INT4 weight as float", e + "w1.weight", "dtype",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kF32, t.at(name).shape());
       }},
      {"INT4 weight of the wrong shape", e + "w2.weight", "shape",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kI32, {64, 15});
       }},
      {"FP8 weight left BF16", a + "o_proj.weight", "ignored_layers",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kBF16, t.at(name).shape());
       }},
      {"FP8 weight of the wrong shape", a + "q_proj.weight", "shape",
       [](TensorMap& t, const std::string& name) {
         t[name] = Tensor::zeros(DType::kF8E4M3, {64, 63});
       }},
  };
  for (const TensorCase& c : cases) {
    const std::string error = variant_error([&](TensorMap& t) { c.change(t, c.tensor); });
    std::cout << c.what << ": " << error << "\n";  // what a user reads
    EXPECT_NE(error.find("\"" + c.tensor + "\""), std::string::npos) << c.what << ": " << error;
    EXPECT_NE(error.find(c.detail), std::string::npos) << c.what << ": " << error;
  }
}

struct ConfigCase {
  const char* field;  // must appear in the error
  std::function<void(nlohmann::json&)> change;
};

TEST_F(QuarkLoader, UnsupportedConfigFieldsAreNamed) {
  const std::vector<ConfigCase> cases{
      {"quant_method", [](nlohmann::json& q) { q["quant_method"] = "awq"; }},
      {"quant_method", [](nlohmann::json& q) { q.erase("quant_method"); }},
      {"int4_experts.group", [](nlohmann::json& q) { q["int4_experts"]["group"] = 128; }},
      {"int4_experts.bits", [](nlohmann::json& q) { q["int4_experts"]["bits"] = 8; }},
      {"int4_experts.sym", [](nlohmann::json& q) { q["int4_experts"]["sym"] = false; }},
      {"export.pack_method", [](nlohmann::json& q) { q["export"]["pack_method"] = "order"; }},
      {"activation_scheme", [](nlohmann::json& q) { q["activation_scheme"] = "per_token"; }},
      {"kv_cache_scheme", [](nlohmann::json& q) { q["kv_cache_scheme"] = 3; }},
      {"weight_block_size",
       [](nlohmann::json& q) {
         q["weight_block_size"] = {128, 128};
       }},
      {"ignored_layers", [](nlohmann::json& q) { q["ignored_layers"] = "lm_head"; }},
      {"fp8_dtype", [](nlohmann::json& q) { q["fp8_dtype"] = "float8_e5m2"; }},
  };
  for (const ConfigCase& c : cases) {
    const std::string error =
        variant_error({}, [&](nlohmann::json& config) { c.change(config["quantization_config"]); });
    std::cout << error << "\n";
    EXPECT_NE(error.find(cat("\"quantization_config.", c.field, "\"")), std::string::npos)
        << c.field << ": " << error;
    EXPECT_NE(error.find("config.json"), std::string::npos) << error;
  }
  // The same errors come from resolving --quantization auto, before any tensor is read.
  ModelConfig config = load_model_config(quantized());
  (*config.quantization_config)["quant_method"] = "gptq";
  EXPECT_NE(
      error_of([&] { resolve_quantization(Quantization::kAuto, config); }).find("quant_method"),
      std::string::npos);
}

TEST_F(QuarkLoader, OnlineSchemesCannotBeAppliedToAQuantizedCheckpoint) {
  const ModelConfig config = load_model_config(quantized());
  EXPECT_EQ(resolve_quantization(Quantization::kQuarkInt4Fp8Moe, config),
            Quantization::kQuarkInt4Fp8Moe);
  for (const Quantization q : {Quantization::kNone, Quantization::kFp8}) {
    const std::string error = error_of([&] { resolve_quantization(q, config); });
    EXPECT_NE(error.find("pre-quantized as quark_int4fp8_moe"), std::string::npos) << error;
    EXPECT_NE(error.find(cat("--quantization ", quantization_name(q))), std::string::npos) << error;
  }
}

// Layer 2's o_proj and all of layer 1's experts listed in ignored_layers and stored in BF16 load as
// BF16, equal to the bf16 checkpoint's; the rest stays quantized.
TEST_F(QuarkLoader, IgnoredLayersStayBf16) {
  const Checkpoint source = Checkpoint::open(kModel);
  const fs::path path = dir_->path() / "ignored";
  test::write_variant(
      quantized(), path,
      [&](TensorMap& t) {
        const auto keep_bf16 = [&](const std::string& layer) {
          for (const char* suffix : {".weight_scale", ".weight_scale1", ".input_scale"})
            t.erase(layer + suffix);
          t[layer + ".weight"] = test::owned(source.get(layer + ".weight"));
        };
        keep_bf16("model.layers.2.self_attn.o_proj");
        for (int e = 0; e < 4; ++e)
          for (const char* w : {"w1", "w2", "w3"})
            keep_bf16(cat("model.layers.1.block_sparse_moe.experts.", e, ".", w));
      },
      [](nlohmann::json& config) {
        auto& ignored = config["quantization_config"]["ignored_layers"];
        ignored.push_back("model.layers.2.self_attn.o_proj");
        ignored.push_back("model.layers.1.block_sparse_moe.experts.*");
      });
  auto loaded = test::load_quark(path);
  auto bf16 = test::load(kModel, Quantization::kNone);
  const ModelWeights& w = loaded->weights;
  const ModelWeights& ref = bf16->model->weights();
  EXPECT_TRUE(
      test::same_linear(w.layers[2].attention.o_proj, ref.layers[2].attention.o_proj, "o_proj"));
  EXPECT_EQ(w.layers[2].attention.o_proj.input_scale, 0.0f);
  EXPECT_EQ(w.layers[2].attention.qkv_proj.format, WeightFormat::kFp8);
  EXPECT_EQ(w.layers[1].attention.o_proj.format, WeightFormat::kFp8);
  EXPECT_EQ(w.layers[1].moe.experts.format, WeightFormat::kBf16);
  EXPECT_TRUE(test::same_bytes(w.layers[1].moe.experts.gate_up, ref.layers[1].moe.experts.gate_up,
                               "gate_up"));
  EXPECT_TRUE(
      test::same_bytes(w.layers[1].moe.experts.down, ref.layers[1].moe.experts.down, "down"));
  EXPECT_EQ(w.layers[0].moe.experts.format, WeightFormat::kInt4);

  // Listing only part of a fused group, or part of a layer's experts, is refused clearly.
  std::string error = variant_error({}, [](nlohmann::json& config) {
    config["quantization_config"]["ignored_layers"].push_back("*.k_proj");
  });
  EXPECT_NE(error.find("fused"), std::string::npos) << error;
  error = variant_error({}, [](nlohmann::json& config) {
    config["quantization_config"]["ignored_layers"].push_back(
        "model.layers.0.block_sparse_moe.experts.3.w2");
  });
  EXPECT_NE(error.find("model.layers.0.block_sparse_moe.experts.3.w2"), std::string::npos) << error;
}

// An e4m3fnuz checkpoint holding the same values (same bytes, which read as fnuz are half the fn
// value, so twice the scale) loads to the same weights; the fnuz NaN byte 0x80 becomes 0. The
// encoding is signalled by quantization_config.fp8_dtype, or by the tensors' own safetensors dtype
// F8_E4M3FNUZ (what torch.float8_e4m3fnuz tensors are saved as).
class QuarkLoaderFnUz : public QuarkLoader, public ::testing::WithParamInterface<bool> {};

TEST_P(QuarkLoaderFnUz, IsConvertedOnLoad) {
  const bool by_dtype = GetParam();
  const fs::path path = dir_->path() / (by_dtype ? "fnuz-dtype" : "fnuz-config");
  const std::string poisoned = "model.layers.0.self_attn.q_proj.weight";
  test::write_variant(
      quantized(), path,
      [&](TensorMap& t) {
        for (auto& [name, tensor] : t) {
          if (tensor.dtype() != DType::kF8E4M3) continue;
          for (int64_t i = 0; i < tensor.numel(); ++i)
            if (tensor.data<uint8_t>()[i] == 0x80)
              tensor.data<uint8_t>()[i] = 0;  // fn -0: NaN in fnuz
          t.at(name.substr(0, name.size() - 7) + ".weight_scale").data<float>()[0] *= 2;
        }
        t.at(poisoned).data<uint8_t>()[5] = 0x80;
        if (by_dtype)
          for (auto& [name, tensor] : t)
            if (tensor.dtype() == DType::kF8E4M3) {
              Tensor fnuz = Tensor::zeros(DType::kF8E4M3FnUz, tensor.shape());
              std::memcpy(fnuz.raw(), tensor.raw(), tensor.nbytes());
              tensor = fnuz;
            }
      },
      [&](nlohmann::json& config) {
        if (!by_dtype) config["quantization_config"]["fp8_dtype"] = "float8_e4m3fnuz";
      });
  auto fnuz = test::load_quark(path);
  auto fn = test::load_quark(quantized());
  for (std::size_t i = 0; i < fn->weights.layers.size(); ++i)
    for (const auto member : {&AttentionWeights::qkv_proj, &AttentionWeights::o_proj}) {
      const Linear& a = fn->weights.layers[i].attention.*member;
      const Linear& b = fnuz->weights.layers[i].attention.*member;
      EXPECT_TRUE(test::same_bytes(a.scale, b.scale, cat("layer ", i, " scale")));
      for (int64_t k = 0; k < a.weight.numel(); ++k) {
        const float x = fp8_e4m3_to_float(a.weight.data<uint8_t>()[k]);
        const float y = fp8_e4m3_to_float(b.weight.data<uint8_t>()[k]);
        if (i == 0 && member == &AttentionWeights::qkv_proj && k == 5)
          EXPECT_EQ(b.weight.data<uint8_t>()[k], 0);
        else
          ASSERT_EQ(x, y) << "layer " << i << " element " << k;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Signal, QuarkLoaderFnUz, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "SafetensorsDtype" : "ConfigFp8Dtype"; });

// Older exports name the KV scales k_scale/v_scale (or kv_scale) under self_attn.
TEST_F(QuarkLoader, OtherKvScaleNamesAreRead) {
  const fs::path path = dir_->path() / "kv-names";
  const std::string a = "model.layers.0.self_attn.";
  float k = 0, v = 0;
  test::write_variant(quantized(), path, [&](TensorMap& t) {
    k = t.at(a + "k_proj.output_scale").data<float>()[0];
    v = t.at(a + "v_proj.output_scale").data<float>()[0];
    t[a + "k_scale"] = test::f32_scalar(k);
    t[a + "v_proj.kv_scale"] = test::f32_scalar(v);
    t.erase(a + "k_proj.output_scale");
    t.erase(a + "v_proj.output_scale");
  });
  auto loaded = test::load_quark(path);
  EXPECT_EQ(loaded->weights.layers[0].attention.k_scale, k);
  EXPECT_EQ(loaded->weights.layers[0].attention.v_scale, v);
}

TEST(QuarkConfigGlob, MatchesQuarkPatterns) {
  EXPECT_TRUE(glob_match("*.gate", "model.layers.0.block_sparse_moe.gate"));
  EXPECT_FALSE(glob_match("*.gate", "model.layers.0.block_sparse_moe.gate_proj"));
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
  EXPECT_FALSE(glob_match("lm_head", "lm_head2"));
  EXPECT_TRUE(glob_match("model.layers.*.self_attn.*", "model.layers.12.self_attn.q_proj"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("a*b*c", "abxbx"));
}

}  // namespace
}  // namespace nibble
