// Shared model flags, model loading (checkpoint or dummy) with its memory plan, and KV cache sizing
// for the `nibble` subcommands.
#include "model_options.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include <unistd.h>

#include "cpu/cpu_ops.h"
#include "cpu/thread_communicator.h"
#ifdef NIBBLE_HAS_CUDA
#include "cuda/cuda_ops.h"
#endif
#ifdef NIBBLE_HAS_NCCL
#include "cuda/tp_device_group.h"
#endif
#include "format/safetensors.h"
#include "model/dummy_weights.h"
#include "model/tensor_parallel.h"

namespace nibble {
namespace {

// INT4 experts pack 8 columns per word: the CPU's shards of the intermediate size keep whole words.
constexpr int64_t kCpuIntermediateMultiple = 8;
// The GPU's expert kernels tile the intermediate size by 64.
constexpr int64_t kCudaIntermediateMultiple = 64;

// Without --max-total-tokens the CPU backend keeps its KV cache this small: taking most of the
// host's memory would only slow a CPU run down.
constexpr int64_t kCpuDefaultKvTokens = 16384;

std::unique_ptr<Ops> make_ops(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuOps>();
#ifdef NIBBLE_HAS_CUDA
  return std::make_unique<cuda::CudaOps>();
#else
  fail("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
#endif
}

const bool kStderrIsTty = isatty(STDERR_FILENO) != 0;

// A live counter on a terminal; one line at the end otherwise (logs stay readable).
void show_progress(int64_t done, int64_t total) {
  if (kStderrIsTty && (done == total || done % 16 == 0))
    std::cerr << "\rloading weights: " << done << "/" << total << (done == total ? "\n" : "")
              << std::flush;
  else if (!kStderrIsTty && done == total)
    std::cerr << "loaded " << total << " tensors\n";
}

const char* kv_dtype_name(KvCacheDType dtype) {
  return dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3" : "bf16";
}

// The plan before loading: a table on the GPU, one line on the CPU; refuses weights that cannot
// fit.
void plan_or_refuse(const ModelConfig& config, const LoadedModel& loaded, const ModelOptions& o) {
  const ModelShape shape = model_shape(config);
  const MemoryInfo memory = loaded.ops->memory_info();
  const MemoryPlan plan = plan_memory(shape, {.quantization = loaded.quantization,
                                              .kv_dtype = loaded.kv_dtype,
                                              .tp_size = o.tp_size,
                                              .device_bytes = memory.total_bytes,
                                              .mem_fraction_static = o.mem_fraction_static});
  if (o.device == "cpu")
    std::cerr << "memory plan: " << format_gb(plan.weight_bytes) << " of weights, "
              << format_gb(plan.budget_bytes) << " for weights and KV cache (--mem-fraction-static "
              << o.mem_fraction_static << " of " << format_gb(memory.total_bytes)
              << " of host memory)\n";
  else
    std::cerr << format_plan(shape, plan);
  check(plan.weight_bytes <= plan.budget_bytes, config.model_type, " ", plan.verdict);
}

// One line per layer (rewritten in place on a terminal).
DummyProgress dummy_progress() {
  return [start = std::chrono::steady_clock::now()](int64_t done, int64_t total, int64_t bytes) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << (kStderrIsTty ? "\r" : "") << "dummy weights: layer " << done << "/" << total
              << ", " << format_gb(bytes) << " in " << seconds << " s"
              << (kStderrIsTty && done < total ? "" : "\n") << std::flush;
  };
}

#ifdef NIBBLE_HAS_NCCL
// --device cuda --tp-size N: rank r on GPU r; dummy weights made per rank from its shard's config,
// a checkpoint loaded on the host once and each rank's shard uploaded one layer at a time.
void load_cuda_tp(const ModelConfig& config, const std::optional<Checkpoint>& checkpoint, const ModelOptions& o,
                  LoadedModel& loaded) {
  const auto start = std::chrono::steady_clock::now();
  CpuOps host_ops;
  const ModelWeights host =
      checkpoint ? load_weights(*checkpoint, config, loaded.quantization, host_ops, show_progress) : ModelWeights{};
  const cuda::RankWeights weights = [&](int rank, const ModelConfig& rank_config, Ops& ops) {
    if (!checkpoint)
      return dummy_weights(rank_config, loaded.quantization, ops, rank == 0 ? dummy_progress() : DummyProgress{});
    return place_shard(host, config, rank, o.tp_size, ops);
  };
  loaded.model = cuda::make_cuda_tp_model(config, o.tp_size, *loaded.ops, weights);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const ModelConfig& rank = loaded.model->config();
  std::cerr << (checkpoint ? "loaded " : "made dummy ") << config.model_type << " (" << config.num_hidden_layers
            << " layers, " << config.num_local_experts << " experts) with quantization "
            << quantization_name(loaded.quantization) << " in " << seconds << " s\n"
            << "tensor parallel: " << o.tp_size
            << " GPUs (NCCL; peer-to-peer sums and maxima up to 4 MB where the GPUs allow it; NVLS off), "
            << rank.num_attention_heads
            << " attention heads, " << rank.num_key_value_heads << " KV heads and intermediate size "
            << rank.intermediate_size << " each\n";
}
#endif

}  // namespace

KvCacheDType parse_kv_cache_dtype(const std::string& name) {
  if (name == "auto" || name == "bf16" || name == "bfloat16") return KvCacheDType::kBf16;
  if (name == "fp8_e4m3" || name == "fp8") return KvCacheDType::kFp8E4M3;
  fail("--kv-cache-dtype ", name, " is not supported (auto, bf16, fp8_e4m3)");
}

void add_model_options(CLI::App& command, ModelOptions& o) {
  command.add_option("--model-path", o.model_path, "model directory (config.json, *.safetensors)")
      ->required();
  command.add_option("--tokenizer-path", o.tokenizer_path,
                     "directory of tokenizer.json (default: --model-path)");
  command
      .add_option("--load-format", o.load_format,
                  "auto (the checkpoint) or dummy (random weights from config.json)")
      ->capture_default_str();
  command.add_option("--quantization", o.quantization, "auto, none, fp8 or quark_int4fp8_moe")
      ->capture_default_str();
  command.add_option("--kv-cache-dtype", o.kv_cache_dtype, "auto, bf16 or fp8_e4m3")
      ->capture_default_str();
  command.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  command.add_option("--tp-size", o.tp_size, "tensor-parallel size")->capture_default_str();
  command
      .add_option("--mem-fraction-static", o.mem_fraction_static,
                  "share of the device's memory for weights and KV cache")
      ->capture_default_str();
  command.add_option("--max-total-tokens", o.max_total_tokens,
                     "KV cache size in tokens (default: what memory allows; 16384 on the CPU)");
  command.add_flag("--disable-cuda-graph", o.disable_cuda_graph,
                   "run decode steps eagerly instead of replaying CUDA graphs");
}

const std::string& tokenizer_dir(const ModelOptions& o) {
  return o.tokenizer_path.empty() ? o.model_path : o.tokenizer_path;
}

LoadedModel load_model(const ModelOptions& o) {
  const std::filesystem::path dir = o.model_path;
  check(std::filesystem::is_directory(dir), "model directory ", dir.string(), " does not exist");
  const auto quantization = quantization_from_name(o.quantization);
  check(quantization.has_value(), "--quantization ", o.quantization,
        " is not supported (auto, none, fp8, quark_int4fp8_moe)");
  const KvCacheDType kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype);
  check(o.tp_size >= 1, "--tp-size must be at least 1, got ", o.tp_size);
#ifndef NIBBLE_HAS_NCCL
  check(o.tp_size == 1 || o.device == "cpu", "--tp-size ", o.tp_size,
        " on --device cuda: this build has no NCCL (CMake did not find nccl.h and libnccl; configure "
        "with -DNIBBLE_NCCL_ROOT=<dir with include/ and lib/>)");
#endif
  check(o.device == "cpu" || o.device == "cuda", "--device ", o.device,
        " is not supported (cpu, cuda)");
  check(o.load_format == "auto" || o.load_format == "dummy", "--load-format ", o.load_format,
        " is not supported (auto, dummy)");
  check(o.mem_fraction_static > 0 && o.mem_fraction_static <= 1,
        "--mem-fraction-static must be in (0, 1], got ", o.mem_fraction_static);
  check(o.max_total_tokens >= 0, "--max-total-tokens must be positive, got ", o.max_total_tokens);
  const bool dummy = o.load_format == "dummy";

  ModelConfig config = load_model_config(dir);
  const bool cuda_tp = o.tp_size > 1 && o.device == "cuda";
  if (o.tp_size > 1)
    check_tp_size(config, o.tp_size, cuda_tp ? kCudaIntermediateMultiple : kCpuIntermediateMultiple);
#ifdef NIBBLE_HAS_NCCL
  if (cuda_tp) cuda::check_gpu_count(o.tp_size);  // before any GPU work
#endif
  const std::optional<Checkpoint> checkpoint =
      dummy ? std::nullopt : std::optional(Checkpoint::open(dir));
  LoadedModel loaded;
  loaded.ops = make_ops(o.device);
  loaded.quantization = resolve_quantization(*quantization, config);
  loaded.kv_dtype = kv_dtype;
  plan_or_refuse(config, loaded, o);
#ifdef NIBBLE_HAS_NCCL
  if (cuda_tp) {
    load_cuda_tp(config, checkpoint, o, loaded);
    return loaded;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  ModelWeights weights =
      dummy ? dummy_weights(config, loaded.quantization, *loaded.ops, dummy_progress())
            : load_weights(*checkpoint, config, loaded.quantization, *loaded.ops, show_progress);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << (dummy ? "made dummy " : "loaded ") << config.model_type << " ("
            << config.num_hidden_layers << " layers, " << config.num_local_experts
            << " experts) with quantization " << quantization_name(loaded.quantization) << " in "
            << seconds << " s\n";
  if (o.tp_size > 1) {  // the ranks as threads, each with its own CPU backend
    std::vector<std::unique_ptr<Ops>> peers;
    for (int r = 1; r < o.tp_size; ++r) peers.push_back(make_ops(o.device));
    loaded.model = std::make_unique<TensorParallelModel>(config, weights, *loaded.ops, std::move(peers),
                                                         make_thread_communicators(o.tp_size));
    std::cerr << "tensor parallel: " << o.tp_size << " ranks (threads), "
              << loaded.model->config().num_attention_heads << " attention heads and intermediate size "
              << loaded.model->config().intermediate_size << " each\n";
    return loaded;
  }
  loaded.model = std::make_unique<Model>(std::move(config), std::move(weights), *loaded.ops);
  return loaded;
}

int64_t kv_cache_tokens(const LoadedModel& m, const ModelOptions& o, const KvSizing& s) {
  const ModelConfig& c = m.model->config();
  const int64_t bs = s.block_size;
  const auto round_up = [bs](int64_t n) { return (n + bs - 1) / bs * bs; };
  const int64_t per_token = kv_bytes_per_token(model_shape(c), m.kv_dtype);
  const MemoryInfo memory = m.ops->memory_info();
  const int64_t activations = step_activation_bytes(c, s.largest_step_tokens, s.max_logit_rows);
  const KvBudget budget = kv_budget(memory, o.mem_fraction_static, per_token, activations, bs);
  int64_t tokens = budget.tokens;
  if (o.max_total_tokens > 0) {
    if (round_up(o.max_total_tokens) > budget.tokens)
      std::cerr << "nibble: warning: --max-total-tokens " << o.max_total_tokens
                << " is more than the memory allows (" << budget.tokens << " tokens); using "
                << budget.tokens << "\n";
    else
      tokens = round_up(o.max_total_tokens);
  } else if (o.device == "cpu") {
    tokens = std::min(tokens, std::max(kCpuDefaultKvTokens, round_up(s.want_tokens)));
  }
  if (s.want_tokens > 0) tokens = std::min(tokens, round_up(s.want_tokens));
  const int64_t needed = std::max<int64_t>(s.min_tokens, 1);
  if (tokens < needed && tokens < budget.tokens)
    fail("--max-total-tokens ", o.max_total_tokens, " is too small: ", needed,
         " tokens of KV cache are needed");
  check(tokens >= needed, "not enough memory for the KV cache: ", needed, " tokens (",
        format_gb(needed * per_token), " in ", kv_dtype_name(m.kv_dtype), ") are needed, but ",
        tokens, " fit: ", format_gb(memory.free_bytes), " is free after the weights and ",
        format_gb(budget.reserve_bytes), " stays free for activations (--mem-fraction-static ",
        o.mem_fraction_static,
        "); use --kv-cache-dtype fp8_e4m3, a smaller --quantization, fewer tokens, or a larger "
        "--mem-fraction-static");
  std::cerr << "KV cache: " << tokens << " tokens (" << kv_dtype_name(m.kv_dtype) << ", "
            << format_gb(tokens * per_token) << "); " << format_gb(budget.reserve_bytes)
            << " stays free for activations (a step of " << s.largest_step_tokens
            << " tokens needs about " << format_gb(activations) << ")\n";
  return tokens;
}

}  // namespace nibble
