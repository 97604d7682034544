// The tiny random Mixtral fixture (tools/make_tiny_mixtral.py) against Hugging Face transformers'
// float32 logits, and every quantization scheme against nibble's own bf16 path.
#include <gtest/gtest.h>

#include <iostream>

#include "core/npy.h"
#include "fixture_test_util.h"

namespace nibble {
namespace {

using test::compare;
using test::Comparison;
using test::full_logits;

constexpr char kModel[] = "tests/fixtures/tiny-mixtral";
constexpr char kLogits[] = "tests/fixtures/tiny-mixtral-logits.npy";
constexpr char kReference[] = "tests/fixtures/tiny-mixtral-reference.json";

nlohmann::json reference() { return test::read_json(kReference); }

std::unique_ptr<test::Loaded> load(Quantization q) { return test::load(kModel, q); }

std::vector<int32_t> prompt_ids() { return reference()["ids"].get<std::vector<int32_t>>(); }

TEST(TinyMixtral, Bf16MatchesTransformers) {
  const Tensor hf = read_npy(kLogits);
  auto l = load(Quantization::kNone);
  const Comparison c = compare(hf, full_logits(*l->model, prompt_ids(), KvCacheDType::kBf16));
  std::cout << "bf16 vs transformers fp32: worst per-position relative L2 " << c.worst << "\n";
  EXPECT_LE(c.worst, 1e-2);
  EXPECT_EQ(c.argmax_diff, 0);
}

TEST(TinyMixtral, Bf16GreedyMatchesTransformers) {
  auto l = load(Quantization::kNone);
  const auto expected = reference()["greedy_32"].get<std::vector<int32_t>>();
  const auto got = generate(*l->model, prompt_ids(), 32, {}, KvCacheDType::kBf16, {});
  EXPECT_EQ(got, expected);
}

TEST(TinyMixtral, DecodeOneAtATimeEqualsOneForward) { test::expect_stepwise_equals_full(kModel); }

// Quantized schemes against nibble's bf16 logits. The bounds are the errors measured on this
// fixture (printed) with about 1.5x headroom on the mean; a regression in any scheme's numerics
// (a wrong scale, packing or rounding) moves the mean error to order one.
TEST(TinyMixtral, QuantizedSchemesStayCloseToBf16) {
  // Measured (mean, worst): fp8 KV 0.063, 0.45; fp8 0.168, 0.59; W4A8 0.282, 0.60; W4A8 + fp8 KV
  // 0.289, 0.60. A random tiny MoE is far more sensitive than a trained one: small perturbations
  // flip its top-2 experts (the trained demo model measures accuracy instead); a wrong scale, packing
  // or rounding moves the mean error to order one.
  test::expect_schemes_close_to_bf16(kModel, {{Quantization::kNone, KvCacheDType::kFp8E4M3, 0.10, 0.7},
                                              {Quantization::kFp8, KvCacheDType::kBf16, 0.25, 0.9},
                                              {Quantization::kQuarkInt4Fp8Moe, KvCacheDType::kBf16, 0.42, 0.9},
                                              {Quantization::kQuarkInt4Fp8Moe, KvCacheDType::kFp8E4M3, 0.43, 0.9}});
}

TEST(TinyMixtral, MissingTensorIsNamed) {
  CpuOps ops;
  ModelConfig config = load_model_config(kModel);
  config.num_local_experts = 5;  // the checkpoint has 4: expert 4 is missing (and the router is short)
  try {
    load_weights(Checkpoint::open(kModel), config, Quantization::kNone, ops);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_sparse_moe.gate.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nibble
