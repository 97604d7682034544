// The memory plan: how many bytes one GPU needs for a model's weights (by tensor class) and for
// each token of KV cache, at a quantization scheme and a tensor-parallel size, worked out from
// config.json alone, before anything is loaded; and the KV-cache budget once the weights are on the
// device. Not an allocator: it predicts and checks. Sizes are bytes; messages print GB = 2^30 bytes
// (as SGLang and nvidia-smi count). Mixtral and Grok-1 run in nibble; qwen3_moe and deepseek_v3
// configs are read here too, for planning only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/weights.h"

namespace nibble {

inline constexpr double kBytesPerGb = 1024.0 * 1024.0 * 1024.0;
// SGLang's --mem-fraction-static default on CUDA: weights + KV cache take this share of the GPU.
inline constexpr double kDefaultMemFractionStatic = 0.88;
// What an H200 reports as its total memory (143771 MiB), the default GPU of `nibble plan`.
inline constexpr double kH200MemoryGb = 143771.0 / 1024.0;

// The weight format of each tensor class under a quantization scheme (the loader's choice):
// routers, norms, embeddings and lm_head are BF16 in every scheme.
struct WeightFormats {
  WeightFormat attention =
      WeightFormat::kBf16;  // q/k/v/o projections; also dense and shared-expert MLPs
  WeightFormat experts = WeightFormat::kBf16;  // routed experts
};
WeightFormats weight_formats(Quantization quantization);  // quantization must not be kAuto

// Bytes of one (rows, cols) weight in `format`, with its F32 per-row scale when quantized.
int64_t weight_bytes(WeightFormat format, int64_t rows, int64_t cols);

enum class AttentionKind : uint8_t {
  kGqa,  // q/k/v/o projections, K and V cached per kv head (Mixtral, Grok-1, Qwen3)
  kMla,  // DeepSeek's multi-head latent attention: one compressed latent per token is cached
};

// The shapes that decide a MoE model's memory, with config.json's names.
struct ModelShape {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  bool tie_word_embeddings = false;
  int64_t norms_per_layer = 2;  // RMSNorm weights (hidden_size) per layer: 4 for Grok-1

  AttentionKind attention = AttentionKind::kGqa;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  bool qk_norm = false;  // Qwen3: RMSNorm weights (head_dim) on q and k
  // MLA only (kMla).
  int64_t q_lora_rank = 0;  // 0: q is projected directly
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  int64_t num_moe_layers = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;            // per routed expert
  int64_t shared_expert_intermediate_size = 0;  // all shared experts of a layer together (DeepSeek)
  bool router_bias = false;                     // DeepSeek's e_score_correction_bias (F32, experts)
  int64_t num_dense_layers = 0;                 // layers with a dense MLP instead of experts
  int64_t dense_intermediate_size = 0;

  std::optional<nlohmann::json> quantization_config;
};

// From a parsed config of an architecture nibble runs.
ModelShape model_shape(const ModelConfig& config);
// From any config.json object: mixtral and grok-1 through parse_model_config (same checks),
// qwen3_moe and deepseek_v3 from their own fields. Other model types fail naming the field.
ModelShape model_shape_from_json(const nlohmann::json& config, const std::string& source);
ModelShape load_model_shape(const std::filesystem::path& model_dir);

// `auto` for planning: the checkpoint's own scheme (quantization_config), else none.
Quantization plan_quantization(Quantization requested, const ModelShape& shape);

// Bytes one GPU holds per token of KV cache (every layer's K and V, or MLA's latent).
int64_t kv_bytes_per_token(const ModelShape& shape, KvCacheDType dtype, int64_t tp_size = 1);

struct PlanOptions {
  Quantization quantization = Quantization::kNone;  // resolved, not kAuto
  KvCacheDType kv_dtype = KvCacheDType::kBf16;
  int64_t tp_size = 1;
  int64_t device_bytes = 0;  // total memory of one GPU
  double mem_fraction_static = kDefaultMemFractionStatic;
  int64_t max_total_tokens = 0;  // KV tokens the user asks for; 0: as many as fit
};

enum class TensorClass : uint8_t {
  kEmbedding,
  kAttention,
  kRouter,
  kExperts,
  kSharedExperts,
  kDenseMlp,
  kNorms,
  kLmHead
};

// One tensor class: its parameters over all ranks and its bytes on one GPU (scales included).
struct PlanLine {
  TensorClass tensor_class = TensorClass::kEmbedding;
  std::string name;    // "experts w1/w3/w2"
  std::string format;  // "int4", "bf16", ...
  std::string split;   // how tensor parallelism divides it
  int64_t parameters = 0;
  int64_t bytes_per_gpu = 0;
};

struct MemoryPlan {
  PlanOptions options;
  std::vector<PlanLine> lines;
  int64_t weight_bytes = 0;        // per GPU
  int64_t kv_bytes_per_token = 0;  // per GPU
  int64_t budget_bytes = 0;        // device_bytes × mem_fraction_static: weights + KV cache
  int64_t kv_tokens = 0;           // tokens the budget leaves room for after the weights
  bool fits = false;
  std::string verdict;  // one line: "fits: ..." or why not
};

// Fails (naming the field) when the shape cannot be split over tp_size GPUs.
MemoryPlan plan_memory(const ModelShape& shape, const PlanOptions& options);
// The plan as a table, one tensor class per row, then the KV cache and the verdict.
std::string format_plan(const ModelShape& shape, const MemoryPlan& plan);
std::string format_gb(int64_t bytes);  // "12.34 GB"

MemoryInfo host_memory_info();  // MemAvailable and MemTotal of /proc/meminfo

// What one decode step reads on one GPU (tp 1), for the roofline: `batch` sequences whose KV holds
// `context_tokens` tokens in all once the step's tokens are written. Weights: every layer's
// attention projections, router and norms, dense and shared MLPs, lm_head and the batch's embedding
// rows, and the routed experts expected to be active under uniform random routing: each token picks
// k distinct experts of E, so an expert is idle with probability (1 − k/E)^batch and E·(1 − (1 −
// k/E)^batch) are read per layer.
struct DecodeBytes {
  int64_t weights = 0;
  int64_t kv = 0;
  double active_experts = 0.0;  // per MoE layer
  int64_t total() const { return weights + kv; }
};
DecodeBytes decode_step_bytes(const ModelShape& shape, Quantization quantization,
                              KvCacheDType kv_dtype, int64_t batch, int64_t context_tokens);

// Device memory that one forward step of `tokens` tokens allocates on the CUDA backend
// (activations, the W4A8 MoE and linear scratch, logits of up to `logit_rows` rows), plus 1 GB for
// the cuBLAS workspace, CUDA graphs and allocator slack. An estimate with margin, not an exact
// count.
int64_t step_activation_bytes(const ModelConfig& config, int64_t tokens, int64_t logit_rows);

// The KV cache that fits once the weights are loaded, SGLang's way: weights + KV cache get
// mem_fraction_static of the device's total memory, so the KV cache gets what is free now minus the
// rest (total × (1 − fraction)), which stays for activations. That reserve is raised to
// `activation_bytes` when the largest step needs more.
struct KvBudget {
  int64_t tokens = 0;         // a multiple of block_size
  int64_t bytes = 0;          // tokens × bytes_per_token
  int64_t reserve_bytes = 0;  // kept free for activations
};
KvBudget kv_budget(const MemoryInfo& after_weights, double mem_fraction_static,
                   int64_t bytes_per_token, int64_t activation_bytes, int64_t block_size);

}  // namespace nibble
