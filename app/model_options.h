// The flags every model command shares (--model-path, --tokenizer-path, --load-format,
// --quantization, --kv-cache-dtype, --device, --tp-size, --mem-fraction-static,
// --max-total-tokens), loading a model from them with its memory plan and progress on stderr, and
// sizing its KV cache.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "format/model_config.h"
#include "engine/model_runner.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/memory_plan.h"
#include "model/model.h"

namespace nibble {

struct ModelOptions {
  std::string model_path;
  std::string tokenizer_path;        // empty: the model path
  std::string load_format = "auto";  // auto: the checkpoint; dummy: random weights from config.json
  std::string quantization = "auto";
  std::string kv_cache_dtype = "auto";
  std::string device = "cpu";
  int tp_size = 1;
  double mem_fraction_static = kDefaultMemFractionStatic;  // weights + KV cache share of the memory
  int64_t max_total_tokens =
      0;  // KV cache tokens; 0: what memory allows (16384 at most on the CPU)
  bool disable_cuda_graph = false;  // --disable-cuda-graph: decode steps run eagerly

  CudaGraphs cuda_graphs() const { return disable_cuda_graph ? CudaGraphs::kOff : CudaGraphs::kOn; }
};

void add_model_options(CLI::App& command, ModelOptions& options);

KvCacheDType parse_kv_cache_dtype(const std::string& name);  // --kv-cache-dtype

// The directory tokenizer.json (and tokenizer_config.json) are read from.
const std::string& tokenizer_dir(const ModelOptions& options);

struct LoadedModel {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Model> model;
  Quantization quantization = Quantization::kNone;
  KvCacheDType kv_dtype = KvCacheDType::kBf16;
};

// Prints the memory plan (a table on CUDA, one line on the CPU) and refuses, before loading, a
// model whose weights exceed --mem-fraction-static of the device's memory.
LoadedModel load_model(const ModelOptions& options);

// What a command needs from the KV cache, to size it (see kv_cache_tokens).
struct KvSizing {
  int64_t block_size = 16;
  int64_t largest_step_tokens = 0;  // the most tokens one forward step computes
  int64_t max_logit_rows = 1;       // the most rows one step returns logits for
  int64_t want_tokens = 0;          // 0: as many as allowed
  int64_t min_tokens = 0;           // fewer than this fails with a message
};

// Tokens of KV cache for `m` on its device, a multiple of the block size: what fits next to the
// loaded weights (kv_budget: the memory beyond --mem-fraction-static, or the largest step's
// activations if more, stays free), capped by --max-total-tokens (with a warning when it asks for
// more than fits, as SGLang does) and by `want_tokens`. Prints the capacity; fails clearly below
// `min_tokens`.
int64_t kv_cache_tokens(const LoadedModel& m, const ModelOptions& options, const KvSizing& sizing);

}  // namespace nibble
