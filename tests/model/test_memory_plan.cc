// The memory plan against byte counts worked out by hand (in the comments) for small configs, the
// tensor-parallel splits and their refusals, the verdicts, the KV budget and the decode roofline
// bytes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/memory_plan.h"

namespace nibble {
namespace {

using nlohmann::json;

// The tiny Mixtral fixture's shape: H 64, I 128, E 4 (top 2), 3 layers, vocab 512, 4 heads of 16,
// 2 kv heads.
json tiny_mixtral() {
  return {{"model_type", "mixtral"},
          {"vocab_size", 512},
          {"hidden_size", 64},
          {"intermediate_size", 128},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 16},
          {"num_local_experts", 4},
          {"num_experts_per_tok", 2},
          {"max_position_embeddings", 512}};
}

ModelShape tiny() {
  return model_shape_from_json(tiny_mixtral(), "tiny");
}

MemoryPlan plan(const ModelShape& s, Quantization q, int64_t tp, int64_t device = int64_t{1} << 40,
                KvCacheDType kv = KvCacheDType::kBf16, int64_t max_total_tokens = 0) {
  return plan_memory(s, {.quantization = q,
                         .kv_dtype = kv,
                         .tp_size = tp,
                         .device_bytes = device,
                         .mem_fraction_static = 0.88,
                         .max_total_tokens = max_total_tokens});
}

int64_t line_bytes(const MemoryPlan& p, TensorClass c) {
  for (const PlanLine& l : p.lines)
    if (l.tensor_class == c) return l.bytes_per_gpu;
  return -1;
}

TEST(MemoryPlan, Bf16ByHand) {
  const MemoryPlan p = plan(tiny(), Quantization::kNone, 1);
  EXPECT_EQ(line_bytes(p, TensorClass::kEmbedding), 512 * 64 * 2);  // 65536
  // q 64 + k 32 + v 32 rows and o 64 rows, each of 64 columns, 2 bytes, 3 layers: 192·64·2·3
  EXPECT_EQ(line_bytes(p, TensorClass::kAttention), 73728);
  EXPECT_EQ(line_bytes(p, TensorClass::kRouter), 3 * 4 * 64 * 2);  // 1536
  // per expert gate_up 256×64 + down 64×128 = 24576 weights: ×2 bytes ×4 experts ×3 layers
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 589824);
  EXPECT_EQ(line_bytes(p, TensorClass::kNorms), (3 * 2 + 1) * 64 * 2);  // 896
  EXPECT_EQ(line_bytes(p, TensorClass::kLmHead), 65536);
  EXPECT_EQ(p.weight_bytes, 65536 + 73728 + 1536 + 589824 + 896 + 65536);
  EXPECT_EQ(p.kv_bytes_per_token,
            3 * 2 * 2 * 16 * 2);  // layers × K,V × kv heads × head_dim × 2 bytes = 384
}

TEST(MemoryPlan, W4A8ByHand) {
  const MemoryPlan p =
      plan(tiny(), Quantization::kQuarkInt4Fp8Moe, 1, int64_t{1} << 40, KvCacheDType::kFp8E4M3);
  // FP8 attention: qkv 128×64 bytes + 128 F32 row scales = 8704; o 64×64 + 64×4 = 4352; 3 layers
  EXPECT_EQ(line_bytes(p, TensorClass::kAttention), 3 * (8704 + 4352));
  // INT4 experts: gate_up 256×64/2 + 256×4 = 9216, down 64×128/2 + 64×4 = 4352; ×4 experts ×3
  // layers
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 12 * (9216 + 4352));
  EXPECT_EQ(p.weight_bytes, 65536 + 39168 + 1536 + 162816 + 896 + 65536);
  EXPECT_EQ(p.kv_bytes_per_token, 192);
}

TEST(MemoryPlan, Fp8ExpertsByHand) {
  const MemoryPlan p = plan(tiny(), Quantization::kFp8, 1);
  // gate_up 256×64 + 256×4 = 17408, down 64×128 + 64×4 = 8448; ×12
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 12 * (17408 + 8448));
}

TEST(MemoryPlan, TensorParallelSplitsByHand) {
  const MemoryPlan p =
      plan(tiny(), Quantization::kQuarkInt4Fp8Moe, 2, int64_t{1} << 40, KvCacheDType::kFp8E4M3);
  EXPECT_EQ(line_bytes(p, TensorClass::kEmbedding), 512 * 64 * 2);  // replicated
  // per rank 2 q heads and 1 kv head: qkv (2+1+1)·16 = 64 rows: 64×64 + 64×4 = 4352; o 64×32 + 64×4
  // = 2304
  EXPECT_EQ(line_bytes(p, TensorClass::kAttention), 3 * (4352 + 2304));
  EXPECT_EQ(line_bytes(p, TensorClass::kRouter), 1536);  // replicated
  // I/2 = 64: gate_up 128×64/2 + 128×4 = 4608, down 64×64/2 + 64×4 = 2304
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 12 * (4608 + 2304));
  EXPECT_EQ(line_bytes(p, TensorClass::kNorms), 896);
  EXPECT_EQ(line_bytes(p, TensorClass::kLmHead), 512 * 64 * 2);  // replicated
  EXPECT_EQ(p.kv_bytes_per_token, 3 * 2 * 1 * 16);
  // 4 ranks, 2 kv heads: each rank keeps one kv head (replicated), so KV per token stays 96.
  EXPECT_EQ(plan(tiny(), Quantization::kNone, 4, int64_t{1} << 40, KvCacheDType::kFp8E4M3)
                .kv_bytes_per_token,
            96);
}

TEST(MemoryPlan, RefusesSplitsThatDoNotDivide) {
  try {
    plan(tiny(), Quantization::kNone, 3);
    FAIL() << "tp 3 of 4 heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_attention_heads"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, VerdictsAtTheBudget) {
  const int64_t weights = 335488;  // W4A8, tp 1 (W4A8ByHand)
  // budget = floor(device × 0.88); KV tokens = (budget − weights) / 192
  const MemoryPlan fits =
      plan(tiny(), Quantization::kQuarkInt4Fp8Moe, 1, 400000, KvCacheDType::kFp8E4M3);
  EXPECT_TRUE(fits.fits) << fits.verdict;
  EXPECT_EQ(fits.budget_bytes, 352000);
  EXPECT_EQ(fits.kv_tokens, (352000 - weights) / 192);  // 86
  const MemoryPlan too_many =
      plan(tiny(), Quantization::kQuarkInt4Fp8Moe, 1, 400000, KvCacheDType::kFp8E4M3, 87);
  EXPECT_FALSE(too_many.fits);
  EXPECT_NE(too_many.verdict.find("--max-total-tokens 87"), std::string::npos) << too_many.verdict;
  const MemoryPlan too_big =
      plan(tiny(), Quantization::kQuarkInt4Fp8Moe, 1, 380000, KvCacheDType::kFp8E4M3);
  EXPECT_FALSE(too_big.fits);
  EXPECT_NE(too_big.verdict.find("the weights alone need"), std::string::npos) << too_big.verdict;
  EXPECT_NE(too_big.verdict.find("--tp-size 2 fits"), std::string::npos) << too_big.verdict;
  const MemoryPlan bf16 = plan(tiny(), Quantization::kNone, 1, 400000);
  EXPECT_NE(bf16.verdict.find("--quantization quark_int4fp8_moe fits"), std::string::npos)
      << bf16.verdict;
}

TEST(MemoryPlan, Qwen3MoeLayersByHand) {
  // 4 layers, decoder_sparse_step 2, mlp_only_layers [1]: layer i has experts when i ∉ {1} and
  // (i + 1) % 2 == 0, so only layer 3; layers 0, 1, 2 are dense.
  const json config = {
      {"model_type", "qwen3_moe"}, {"vocab_size", 100},           {"hidden_size", 32},
      {"intermediate_size", 48},   {"moe_intermediate_size", 16}, {"num_hidden_layers", 4},
      {"num_attention_heads", 4},  {"num_key_value_heads", 2},    {"head_dim", 8},
      {"num_experts", 8},          {"num_experts_per_tok", 2},    {"decoder_sparse_step", 2},
      {"mlp_only_layers", {1}}};
  const ModelShape s = model_shape_from_json(config, "qwen3");
  EXPECT_EQ(s.num_moe_layers, 1);
  EXPECT_EQ(s.num_dense_layers, 3);
  const MemoryPlan p = plan(s, Quantization::kNone, 1);
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 8 * 3 * 16 * 32 * 2);
  EXPECT_EQ(line_bytes(p, TensorClass::kDenseMlp), 3 * 3 * 48 * 32 * 2);
  // norms: 4 layers × 2 × 32 + final 32, and q/k norms 4 × 2 × 8
  EXPECT_EQ(line_bytes(p, TensorClass::kNorms), (4 * 2 * 32 + 32 + 4 * 2 * 8) * 2);
  EXPECT_EQ(p.kv_bytes_per_token, 4 * 2 * 2 * 8 * 2);
}

TEST(MemoryPlan, DeepseekMlaByHand) {
  const json config = {{"model_type", "deepseek_v3"},
                       {"vocab_size", 100},
                       {"hidden_size", 32},
                       {"intermediate_size", 64},
                       {"moe_intermediate_size", 16},
                       {"num_hidden_layers", 3},
                       {"num_attention_heads", 2},
                       {"n_routed_experts", 4},
                       {"n_shared_experts", 1},
                       {"num_experts_per_tok", 2},
                       {"first_k_dense_replace", 1},
                       {"q_lora_rank", 8},
                       {"kv_lora_rank", 8},
                       {"qk_nope_head_dim", 4},
                       {"qk_rope_head_dim", 2},
                       {"v_head_dim", 4},
                       {"quantization_config", {{"quant_method", "fp8"}}}};
  const ModelShape s = model_shape_from_json(config, "deepseek");
  EXPECT_EQ(s.num_dense_layers, 1);
  EXPECT_EQ(s.num_moe_layers, 2);
  EXPECT_EQ(plan_quantization(Quantization::kAuto, s), Quantization::kFp8);
  const MemoryPlan p = plan(s, Quantization::kNone, 1);
  // per layer: q_a 8×32 + q_b 2·6×8 + kv_a (8+2)×32 + kv_b 2·8×8 + o 32×8 = 256+96+320+128+256 =
  // 1056
  EXPECT_EQ(line_bytes(p, TensorClass::kAttention), 3 * 1056 * 2);
  EXPECT_EQ(line_bytes(p, TensorClass::kDenseMlp), 3 * 64 * 32 * 2);
  EXPECT_EQ(line_bytes(p, TensorClass::kExperts), 2 * 4 * 3 * 16 * 32 * 2);
  EXPECT_EQ(line_bytes(p, TensorClass::kSharedExperts), 2 * 3 * 16 * 32 * 2);
  EXPECT_EQ(line_bytes(p, TensorClass::kRouter),
            2 * (4 * 32 * 2 + 4 * 4));               // + the F32 correction bias
  EXPECT_EQ(p.kv_bytes_per_token, 3 * (8 + 2) * 2);  // the latent, any tp
  EXPECT_EQ(plan(s, Quantization::kNone, 2).kv_bytes_per_token, 60);
}

TEST(MemoryPlan, UnknownModelTypeFailsClearly) {
  json config = tiny_mixtral();
  config["model_type"] = "llama";
  try {
    model_shape_from_json(config, "x/config.json");
    FAIL() << "llama was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama"), std::string::npos) << e.what();
  }
}

TEST(MemoryPlan, KvBudgetKeepsTheLargerReserve) {
  // total 20000, fraction 0.88: 2400 stays free unless the activations need more.
  const MemoryInfo after{.free_bytes = 10000, .total_bytes = 20000};
  const KvBudget small = kv_budget(after, 0.88, 10, 1000, 16);
  EXPECT_EQ(small.reserve_bytes, 2400);
  EXPECT_EQ(small.tokens, 752);  // (10000 − 2400) / 10 = 760, down to a multiple of 16
  const KvBudget large = kv_budget(after, 0.88, 10, 5000, 16);
  EXPECT_EQ(large.reserve_bytes, 5000);
  EXPECT_EQ(large.tokens, 496);
  EXPECT_EQ(kv_budget({.free_bytes = 1000, .total_bytes = 20000}, 0.88, 10, 0, 16).tokens, 0);
}

TEST(MemoryPlan, DecodeStepBytesByHand) {
  // bf16, batch 3, 63 tokens of KV: embedding rows 3·64·2 = 384, attention 73728, routers 1536,
  // experts 589824 × (4·(1 − (1 − 2/4)³) = 3.5 active of 4), norms 896, lm_head 65536.
  const DecodeBytes d = decode_step_bytes(tiny(), Quantization::kNone, KvCacheDType::kBf16, 3, 63);
  EXPECT_DOUBLE_EQ(d.active_experts, 3.5);
  EXPECT_EQ(d.weights, 384 + 73728 + 1536 + 516096 + 896 + 65536);
  EXPECT_EQ(d.kv, 63 * 384);
  // One token reads exactly its top-k experts.
  EXPECT_DOUBLE_EQ(
      decode_step_bytes(tiny(), Quantization::kNone, KvCacheDType::kBf16, 1, 1).active_experts,
      2.0);
}

}  // namespace
}  // namespace nibble
