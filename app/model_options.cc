// Shared model flags and model loading for the `nibble` subcommands.
#include "model_options.h"

#include <chrono>
#include <filesystem>
#include <iostream>

#include <unistd.h>

#include "cpu/cpu_ops.h"
#ifdef NIBBLE_HAS_CUDA
#include "cuda/cuda_ops.h"
#endif
#include "format/safetensors.h"

namespace nibble {
namespace {

KvCacheDType parse_kv_dtype(const std::string& name) {
  if (name == "auto" || name == "bf16" || name == "bfloat16") return KvCacheDType::kBf16;
  if (name == "fp8_e4m3" || name == "fp8") return KvCacheDType::kFp8E4M3;
  fail("--kv-cache-dtype ", name, " is not supported (auto, bf16, fp8_e4m3)");
}

// A live counter on a terminal; one line at the end otherwise (logs stay readable).
std::unique_ptr<Ops> make_ops(const std::string& device) {
  if (device == "cpu") return std::make_unique<CpuOps>();
#ifdef NIBBLE_HAS_CUDA
  return std::make_unique<cuda::CudaOps>();
#else
  fail("--device cuda: this build has no CUDA backend (nvcc was not found at build time)");
#endif
}

void show_progress(int64_t done, int64_t total) {
  static const bool tty = isatty(STDERR_FILENO) != 0;
  if (tty && (done == total || done % 16 == 0))
    std::cerr << "\rloading weights: " << done << "/" << total << (done == total ? "\n" : "") << std::flush;
  else if (!tty && done == total)
    std::cerr << "loaded " << total << " tensors\n";
}

}  // namespace

void add_model_options(CLI::App& command, ModelOptions& o) {
  command.add_option("--model-path", o.model_path, "model directory (config.json, *.safetensors)")->required();
  command.add_option("--quantization", o.quantization, "auto, none, fp8 or quark_int4fp8_moe")
      ->capture_default_str();
  command.add_option("--kv-cache-dtype", o.kv_cache_dtype, "auto, bf16 or fp8_e4m3")->capture_default_str();
  command.add_option("--device", o.device, "cpu or cuda")->capture_default_str();
  command.add_option("--tp-size", o.tp_size, "tensor-parallel size")->capture_default_str();
}

LoadedModel load_model(const ModelOptions& o) {
  const std::filesystem::path dir = o.model_path;
  check(std::filesystem::is_directory(dir), "model directory ", dir.string(), " does not exist");
  const auto quantization = quantization_from_name(o.quantization);
  check(quantization.has_value(), "--quantization ", o.quantization,
        " is not supported (auto, none, fp8, quark_int4fp8_moe)");
  const KvCacheDType kv_dtype = parse_kv_dtype(o.kv_cache_dtype);
  check(o.tp_size == 1, "--tp-size ", o.tp_size, " is not supported yet (only 1)");
  check(o.device == "cpu" || o.device == "cuda", "--device ", o.device, " is not supported (cpu, cuda)");

  ModelConfig config = load_model_config(dir);
  const Checkpoint checkpoint = Checkpoint::open(dir);
  LoadedModel loaded;
  loaded.ops = make_ops(o.device);
  loaded.quantization = resolve_quantization(*quantization, config);
  loaded.kv_dtype = kv_dtype;
  const auto start = std::chrono::steady_clock::now();
  ModelWeights weights = load_weights(checkpoint, config, loaded.quantization, *loaded.ops, show_progress);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "loaded " << config.model_type << " (" << config.num_hidden_layers << " layers, "
            << config.num_local_experts << " experts) with quantization " << quantization_name(loaded.quantization)
            << " in " << seconds << " s\n";
  loaded.model = std::make_unique<Model>(std::move(config), std::move(weights), *loaded.ops);
  return loaded;
}

}  // namespace nibble
