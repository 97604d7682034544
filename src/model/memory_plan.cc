// The memory plan: bytes per GPU by tensor class, KV bytes per token, the verdict, and the KV
// budget after loading. Tensor parallelism (DESIGN.md §4) splits experts along their intermediate
// dim, attention by heads (kv heads replicated when there are fewer than ranks; MLA's latent
// projections replicated); embed_tokens, lm_head, routers and norms are replicated, as
// src/model/tensor_parallel.cc places them.
#include "model/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace nibble {
namespace {

std::string params_text(int64_t n) {
  if (n == 0) return "-";
  char text[32];
  if (n >= 1'000'000'000)
    std::snprintf(text, sizeof text, "%.2f B", static_cast<double>(n) / 1e9);
  else
    std::snprintf(text, sizeof text, "%.2f M", static_cast<double>(n) / 1e6);
  return text;
}

const char* kv_dtype_name(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3" : "bf16";
}

// Rows of a GQA projection's kv heads on one rank: split, or one head each when ranks outnumber
// them.
int64_t kv_heads_per_rank(const ModelShape& s, int64_t tp) {
  return s.num_key_value_heads >= tp ? s.num_key_value_heads / tp : 1;
}

// Why the shape cannot be split over tp GPUs, or "" when it can.
std::string split_problem(const ModelShape& s, int64_t tp) {
  const auto not_divisible = [&](const char* field, int64_t value) {
    return value % tp == 0 ? std::string()
                           : cat(s.model_type, ": \"", field, "\" (", value,
                                 ") is not divisible by --tp-size ", tp);
  };
  std::string problem = not_divisible("num_attention_heads", s.num_attention_heads);
  if (problem.empty() && s.attention == AttentionKind::kGqa && s.num_key_value_heads >= tp)
    problem = not_divisible("num_key_value_heads", s.num_key_value_heads);
  if (problem.empty() && s.attention == AttentionKind::kGqa && tp % s.num_key_value_heads != 0 &&
      s.num_key_value_heads < tp)
    problem = cat(s.model_type, ": --tp-size ", tp,
                  " is not a multiple of \"num_key_value_heads\" (", s.num_key_value_heads, ")");
  if (problem.empty() && s.num_moe_layers > 0)
    problem = not_divisible("moe_intermediate_size", s.moe_intermediate_size);
  if (problem.empty() && s.shared_expert_intermediate_size > 0)
    problem = not_divisible("n_shared_experts × moe_intermediate_size",
                            s.shared_expert_intermediate_size);
  if (problem.empty() && s.num_dense_layers > 0)
    problem = not_divisible("intermediate_size", s.dense_intermediate_size);
  return problem;
}

// A gated MLP (gate and up: inter × H, down: H × inter), split along inter.
int64_t mlp_bytes(WeightFormat format, int64_t hidden, int64_t inter, int64_t tp) {
  return weight_bytes(format, 2 * inter / tp, hidden) + weight_bytes(format, hidden, inter / tp);
}

PlanLine attention_line(const ModelShape& s, WeightFormat f, int64_t tp) {
  const int64_t H = s.hidden_size, L = s.num_hidden_layers, heads = s.num_attention_heads;
  PlanLine line{.tensor_class = TensorClass::kAttention,
                .name = "attention",
                .format = weight_format_name(f),
                .split = "heads / tp"};
  if (s.attention == AttentionKind::kGqa) {
    const int64_t D = s.head_dim, q = heads * D, kv = s.num_key_value_heads * D;
    line.name = "attention q/k/v/o";
    if (s.num_key_value_heads < tp) line.split = "heads / tp, kv heads replicated";
    line.parameters = L * (2 * q * H + 2 * kv * H);
    line.bytes_per_gpu = L * (weight_bytes(f, (heads / tp + 2 * kv_heads_per_rank(s, tp)) * D, H) +
                              weight_bytes(f, H, q / tp));
    return line;
  }
  const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim,
                latent = s.kv_lora_rank + s.qk_rope_head_dim;
  line.name = "attention (MLA)";
  line.split = "heads / tp, latents replicated";
  const int64_t q_params =
      s.q_lora_rank > 0 ? s.q_lora_rank * H + heads * qk * s.q_lora_rank : heads * qk * H;
  line.parameters =
      L * (q_params + latent * H + heads * (s.qk_nope_head_dim + s.v_head_dim) * s.kv_lora_rank +
           H * heads * s.v_head_dim);
  const int64_t q_bytes = s.q_lora_rank > 0 ? weight_bytes(f, s.q_lora_rank, H) +
                                                  weight_bytes(f, heads / tp * qk, s.q_lora_rank)
                                            : weight_bytes(f, heads / tp * qk, H);
  line.bytes_per_gpu =
      L * (q_bytes + weight_bytes(f, latent, H) +
           weight_bytes(f, heads / tp * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank) +
           weight_bytes(f, H, heads / tp * s.v_head_dim));
  return line;
}

std::vector<PlanLine> plan_lines(const ModelShape& s, const WeightFormats& f, int64_t tp) {
  const int64_t H = s.hidden_size, V = s.vocab_size, L = s.num_hidden_layers;
  std::vector<PlanLine> lines;
  lines.push_back({.tensor_class = TensorClass::kEmbedding,
                   .name = "embed_tokens",
                   .format = "bf16",
                   .split = "replicated",
                   .parameters = V * H,
                   .bytes_per_gpu = V * H * 2});
  lines.push_back(attention_line(s, f.attention, tp));
  if (s.num_moe_layers > 0) {
    const int64_t E = s.num_experts, I = s.moe_intermediate_size, Lm = s.num_moe_layers;
    lines.push_back({.tensor_class = TensorClass::kRouter,
                     .name = "router",
                     .format = "bf16",
                     .split = "replicated",
                     .parameters = Lm * E * H,
                     .bytes_per_gpu = Lm * (E * H * 2 + (s.router_bias ? E * 4 : 0))});
    lines.push_back({.tensor_class = TensorClass::kExperts,
                     .name = "experts w1/w3/w2",
                     .format = weight_format_name(f.experts),
                     .split = "intermediate / tp",
                     .parameters = Lm * E * 3 * I * H,
                     .bytes_per_gpu = Lm * E * mlp_bytes(f.experts, H, I, tp)});
  }
  if (s.shared_expert_intermediate_size > 0) {
    const int64_t S = s.shared_expert_intermediate_size;
    lines.push_back({.tensor_class = TensorClass::kSharedExperts,
                     .name = "shared experts",
                     .format = weight_format_name(f.attention),
                     .split = "intermediate / tp",
                     .parameters = s.num_moe_layers * 3 * S * H,
                     .bytes_per_gpu = s.num_moe_layers * mlp_bytes(f.attention, H, S, tp)});
  }
  if (s.num_dense_layers > 0) {
    const int64_t I = s.dense_intermediate_size;
    lines.push_back({.tensor_class = TensorClass::kDenseMlp,
                     .name = "dense MLP",
                     .format = weight_format_name(f.attention),
                     .split = "intermediate / tp",
                     .parameters = s.num_dense_layers * 3 * I * H,
                     .bytes_per_gpu = s.num_dense_layers * mlp_bytes(f.attention, H, I, tp)});
  }
  int64_t norm_params = (L * s.norms_per_layer + 1) * H;
  if (s.qk_norm) norm_params += L * 2 * s.head_dim;
  if (s.attention == AttentionKind::kMla) norm_params += L * (s.q_lora_rank + s.kv_lora_rank);
  lines.push_back({.tensor_class = TensorClass::kNorms,
                   .name = "norms",
                   .format = "bf16",
                   .split = "replicated",
                   .parameters = norm_params,
                   .bytes_per_gpu = norm_params * 2});
  // A tied lm_head is still its own copy on the device (the loader uploads it as a Linear).
  lines.push_back({.tensor_class = TensorClass::kLmHead,
                   .name = s.tie_word_embeddings ? "lm_head (tied, own copy)" : "lm_head",
                   .format = "bf16",
                   .split = "replicated",
                   .parameters = s.tie_word_embeddings ? 0 : V * H,
                   .bytes_per_gpu = V * H * 2});
  return lines;
}

int64_t total_bytes(const std::vector<PlanLine>& lines) {
  int64_t total = 0;
  for (const PlanLine& line : lines) total += line.bytes_per_gpu;
  return total;
}

// What would make the weights fit: a smaller scheme at this --tp-size, else the smallest larger
// --tp-size (up to 64) at this scheme.
std::string remedy(const ModelShape& s, const PlanOptions& o, int64_t budget) {
  for (Quantization q : {Quantization::kFp8, Quantization::kQuarkInt4Fp8Moe}) {
    const bool smaller =
        o.quantization == Quantization::kNone ||
        (o.quantization == Quantization::kFp8 && q == Quantization::kQuarkInt4Fp8Moe);
    if (smaller && total_bytes(plan_lines(s, weight_formats(q), o.tp_size)) <= budget)
      return cat("--quantization ", quantization_name(q), " fits");
  }
  for (int64_t tp = o.tp_size + 1; tp <= 64; ++tp)
    if (split_problem(s, tp).empty() &&
        total_bytes(plan_lines(s, weight_formats(o.quantization), tp)) <= budget)
      return cat("--tp-size ", tp, " fits");
  return "no --tp-size up to 64 fits";
}

std::string verdict(const ModelShape& s, const MemoryPlan& p) {
  const PlanOptions& o = p.options;
  const std::string budget = cat(format_gb(p.budget_bytes), " (--mem-fraction-static ",
                                 o.mem_fraction_static, " of ", format_gb(o.device_bytes), ")");
  if (p.weight_bytes > p.budget_bytes)
    return cat("does not fit: the weights alone need ", format_gb(p.weight_bytes),
               " per GPU at --quantization ", quantization_name(o.quantization), " --tp-size ",
               o.tp_size, ", more than the ", budget, " for weights and KV cache (",
               remedy(s, o, p.budget_bytes), ")");
  if (o.max_total_tokens > 0 && p.kv_tokens < o.max_total_tokens)
    return cat("does not fit: --max-total-tokens ", o.max_total_tokens, " needs ",
               format_gb(o.max_total_tokens * p.kv_bytes_per_token),
               " of KV cache per GPU, but only ", format_gb(p.budget_bytes - p.weight_bytes),
               " of the ", budget, " is left after the weights");
  if (p.kv_tokens < 1) return cat("does not fit: no room is left for the KV cache in the ", budget);
  return cat("fits: ", format_gb(p.weight_bytes), " of weights and room for ", p.kv_tokens,
             " tokens of KV cache (", format_gb(p.kv_tokens * p.kv_bytes_per_token),
             ") per GPU in the ", budget);
}

}  // namespace

WeightFormats weight_formats(Quantization q) {
  check(q != Quantization::kAuto, "weight_formats: resolve --quantization auto first");
  if (q == Quantization::kQuarkInt4Fp8Moe)
    return {.attention = WeightFormat::kFp8, .experts = WeightFormat::kInt4};
  if (q == Quantization::kFp8)
    return {.attention = WeightFormat::kFp8, .experts = WeightFormat::kFp8};
  return {.attention = WeightFormat::kBf16, .experts = WeightFormat::kBf16};
}

int64_t weight_bytes(WeightFormat format, int64_t rows, int64_t cols) {
  switch (format) {
    case WeightFormat::kBf16:
      return rows * cols * 2;
    case WeightFormat::kFp8:
      return rows * cols + rows * 4;
    case WeightFormat::kInt4:
      return rows * cols / 2 + rows * 4;
  }
  fail("unreachable weight format");
}

Quantization plan_quantization(Quantization requested, const ModelShape& shape) {
  if (requested != Quantization::kAuto) return requested;
  if (!shape.quantization_config) return Quantization::kNone;
  const nlohmann::json& q = *shape.quantization_config;
  const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>()
                                 : "";
  if (q.contains("int4_experts"))
    return Quantization::kQuarkInt4Fp8Moe;  // Quark W4A8 (DESIGN.md §2)
  if (method == "fp8") return Quantization::kFp8;
  fail(shape.model_type, ": quantization_config.quant_method \"", method,
       "\" is not one the memory plan knows (fp8, fp8 with int4_experts); pass --quantization");
}

int64_t kv_bytes_per_token(const ModelShape& s, KvCacheDType dtype, int64_t tp) {
  const int64_t bytes = dtype == KvCacheDType::kFp8E4M3 ? 1 : 2;
  if (s.attention == AttentionKind::kMla)
    return s.num_hidden_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * bytes;
  return s.num_hidden_layers * 2 * kv_heads_per_rank(s, tp) * s.head_dim * bytes;
}

MemoryPlan plan_memory(const ModelShape& s, const PlanOptions& o) {
  check(o.quantization != Quantization::kAuto, "plan_memory: resolve --quantization auto first");
  check(o.mem_fraction_static > 0 && o.mem_fraction_static <= 1,
        "--mem-fraction-static must be in (0, 1], got ", o.mem_fraction_static);
  check(o.device_bytes > 0, "the GPU memory must be positive");
  check(o.tp_size >= 1, "--tp-size must be at least 1, got ", o.tp_size);
  if (const std::string problem = split_problem(s, o.tp_size); !problem.empty()) fail(problem);
  MemoryPlan p{.options = o, .lines = plan_lines(s, weight_formats(o.quantization), o.tp_size)};
  for (const PlanLine& line : p.lines) p.weight_bytes += line.bytes_per_gpu;
  p.kv_bytes_per_token = kv_bytes_per_token(s, o.kv_dtype, o.tp_size);
  p.budget_bytes =
      static_cast<int64_t>(static_cast<double>(o.device_bytes) * o.mem_fraction_static);
  p.kv_tokens = std::max<int64_t>(0, (p.budget_bytes - p.weight_bytes) / p.kv_bytes_per_token);
  p.fits =
      p.weight_bytes <= p.budget_bytes && p.kv_tokens >= std::max<int64_t>(1, o.max_total_tokens);
  p.verdict = verdict(s, p);
  return p;
}

DecodeBytes decode_step_bytes(const ModelShape& s, Quantization quantization, KvCacheDType kv_dtype,
                              int64_t batch, int64_t context_tokens) {
  const MemoryPlan plan = plan_memory(s, {.quantization = quantization,
                                          .kv_dtype = kv_dtype,
                                          .tp_size = 1,
                                          .device_bytes = 1,
                                          .mem_fraction_static = 1.0});
  DecodeBytes d;
  const double E = static_cast<double>(s.num_experts),
               k = static_cast<double>(s.num_experts_per_tok);
  d.active_experts =
      s.num_experts > 0 ? E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(batch))) : 0.0;
  for (const PlanLine& line : plan.lines) {
    if (line.tensor_class == TensorClass::kEmbedding)
      d.weights += batch * s.hidden_size * 2;
    else if (line.tensor_class == TensorClass::kExperts)
      d.weights +=
          static_cast<int64_t>(static_cast<double>(line.bytes_per_gpu) * d.active_experts / E);
    else
      d.weights += line.bytes_per_gpu;
  }
  d.kv = context_tokens * plan.kv_bytes_per_token;
  return d;
}

std::string format_gb(int64_t bytes) {
  char text[32];
  const double gb = static_cast<double>(bytes) / kBytesPerGb;
  if (gb >= 0.1 || bytes == 0)
    std::snprintf(text, sizeof text, "%.2f GB", gb);
  else
    std::snprintf(text, sizeof text, "%.2f MB", gb * 1024.0);
  return text;
}

std::string format_plan(const ModelShape& s, const MemoryPlan& p) {
  const PlanOptions& o = p.options;
  std::ostringstream out;
  out << "memory plan: " << s.model_type << " (" << s.num_hidden_layers << " layers, "
      << s.num_experts << " experts), --quantization " << quantization_name(o.quantization)
      << ", --kv-cache-dtype " << kv_dtype_name(o.kv_dtype) << ", --tp-size " << o.tp_size
      << ", per GPU of " << format_gb(o.device_bytes) << "\n";
  char row[160];
  std::snprintf(row, sizeof row, "  %-26s %-6s %-32s %12s %12s\n", "tensors", "format", "split",
                "parameters", "per GPU");
  out << row;
  for (const PlanLine& l : p.lines) {
    std::snprintf(row, sizeof row, "  %-26s %-6s %-32s %12s %12s\n", l.name.c_str(),
                  l.format.c_str(), l.split.c_str(), params_text(l.parameters).c_str(),
                  format_gb(l.bytes_per_gpu).c_str());
    out << row;
  }
  std::snprintf(row, sizeof row, "  %-79s %12s\n", "weights", format_gb(p.weight_bytes).c_str());
  out << row;
  out << "  KV cache: " << p.kv_bytes_per_token << " bytes per token per GPU ("
      << kv_dtype_name(o.kv_dtype)
      << (s.attention == AttentionKind::kMla ? ", MLA latent, replicated" : ", kv heads / tp")
      << ")\n";
  out << p.verdict << "\n";
  return out.str();
}

MemoryInfo host_memory_info() {
  std::ifstream in("/proc/meminfo");
  MemoryInfo info;
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") info.total_bytes = kb * 1024;
    if (key == "MemAvailable:") info.free_bytes = kb * 1024;
  }
  check(info.total_bytes > 0, "cannot read the host's memory from /proc/meminfo");
  return info;
}

int64_t step_activation_bytes(const ModelConfig& c, int64_t tokens, int64_t logit_rows) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts,
                k = c.num_experts_per_tok;
  const int64_t q = c.num_attention_heads * c.head_dim,
                qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim;
  const int64_t widest = std::max(H, q);
  const int64_t per_token =
      4 * 2 * H                       // residual stream and sublayer output (F32)
      + 2 * (H + qkv + q)             // normed, qkv, attention (BF16)
      + widest + 4 + widest / 64 * 4  // a linear's FP8 input, its scale and block sums
      + 4 * E + 16 * k                // router logits, top-k ids and weights, sorted rows
      + H + 4 + H / 64 * 4            // the MoE input in FP8
      +
      k * (2 * I * 4 + I + 4 + I / 64 * 4 + H * 4);  // gate_up (F32), activation (FP8), down (F32)
  const int64_t logits = logit_rows * (c.vocab_size * 4 + H * 2);
  return tokens * per_token + logits + (int64_t{1} << 30);
}

KvBudget kv_budget(const MemoryInfo& after_weights, double fraction, int64_t bytes_per_token,
                   int64_t activation_bytes, int64_t block_size) {
  check(fraction > 0 && fraction <= 1, "--mem-fraction-static must be in (0, 1], got ", fraction);
  check(bytes_per_token > 0 && block_size > 0, "kv_budget: bad sizes");
  KvBudget b;
  b.reserve_bytes = std::max(
      static_cast<int64_t>(static_cast<double>(after_weights.total_bytes) * (1.0 - fraction)),
      activation_bytes);
  const int64_t room = std::max<int64_t>(0, after_weights.free_bytes - b.reserve_bytes);
  b.tokens = room / bytes_per_token / block_size * block_size;
  b.bytes = b.tokens * bytes_per_token;
  return b;
}

}  // namespace nibble
