// `nibble plan`: the memory plan of a model directory's config.json (no weights needed) for one GPU
// of --gpu-memory-gb at --quantization and --tp-size: the table on stdout, exit 0 when it fits and
// 1 (with the reason on stderr) when it does not.
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "model/memory_plan.h"

namespace nibble {

int run_plan(const Commands& c) {
  const ModelOptions& o = c.model;
  check(std::filesystem::is_directory(o.model_path), "model directory ", o.model_path,
        " does not exist");
  const auto requested = quantization_from_name(o.quantization);
  check(requested.has_value(), "--quantization ", o.quantization,
        " is not supported (auto, none, fp8, quark_int4fp8_moe)");
  check(c.plan_options.gpu_memory_gb > 0, "--gpu-memory-gb must be positive, got ",
        c.plan_options.gpu_memory_gb);
  check(o.max_total_tokens >= 0, "--max-total-tokens must be positive, got ", o.max_total_tokens);
  const ModelShape shape = load_model_shape(o.model_path);
  const MemoryPlan plan = plan_memory(
      shape, {.quantization = plan_quantization(*requested, shape),
              .kv_dtype = parse_kv_cache_dtype(o.kv_cache_dtype),
              .tp_size = o.tp_size,
              .device_bytes = static_cast<int64_t>(c.plan_options.gpu_memory_gb * kBytesPerGb),
              .mem_fraction_static = o.mem_fraction_static,
              .max_total_tokens = o.max_total_tokens});
  std::cout << format_plan(shape, plan) << std::flush;
  check(plan.fits, shape.model_type, " ", plan.verdict);
  return 0;
}

}  // namespace nibble
