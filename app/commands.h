// Subcommand registration and dispatch for the `nibble` command.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "model_options.h"

namespace nibble {

// `nibble serve` (flags follow SGLang's launch_server).
struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;
  std::string served_model_name;  // default: --model-path as given
  int64_t max_running_requests = 64;
  int64_t chunked_prefill_size = 2048;  // prompt tokens per step; -1: no chunking
};

// `nibble bench-one-batch` (SGLang's bench_one_batch: one static batch, no server).
struct BenchOptions {
  int64_t batch_size = 1;
  int64_t input_len = 1024;
  int64_t output_len = 16;
  std::string json;  // write the results here as one JSON object
  std::string run_name = "default";
  uint64_t seed = 0;  // of the random prompts
};

// `nibble plan`: the memory plan of a config, for a GPU of this size.
struct PlanCommandOptions {
  double gpu_memory_gb = kH200MemoryGb;  // GB = 2^30 bytes
};

// `nibble quantize`: writes a pre-quantized checkpoint (Quark W4A8KV8 format) from a bf16 one.
struct QuantizeOptions {
  std::string output;
  std::string quantization = "quark_int4fp8_moe";  // or fp8
  std::string max_shard_size = "5GB";
};

// `nibble eval`: accuracy or perplexity on a held-out set (app/eval_tasks.h).
struct EvalOptions {
  std::string task;     // arithmetic or perplexity
  std::string data;     // JSON Lines; empty: <model-path>/eval/{arithmetic,prose}.jsonl
  int64_t limit = 0;    // the first N items; 0: all
  int64_t max_new_tokens = 64;
  int64_t max_running_requests = 128;
  std::string details;  // per-item JSON Lines here when set
};

struct Commands {
  CLI::App* generate = nullptr;
  CLI::App* logits = nullptr;
  CLI::App* tokenize = nullptr;
  CLI::App* serve = nullptr;
  CLI::App* quantize = nullptr;
  CLI::App* bench_one_batch = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* eval = nullptr;

  ModelOptions model;
  // generate
  std::string prompt;
  int64_t max_new_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int64_t top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  // logits
  std::string ids;
  std::string out;
  // tokenize
  std::string text;
  bool no_special_tokens = false;
  // serve
  ServeOptions serve_options;
  QuantizeOptions quantize_options;
  BenchOptions bench;
  PlanCommandOptions plan_options;
  EvalOptions eval_options;
};

void add_commands(CLI::App& app, Commands& commands);
int run_command(const CLI::App& app, const Commands& commands);

int run_generate(const Commands& commands);
int run_logits(const Commands& commands);
int run_tokenize(const Commands& commands);
int run_serve(const Commands& commands);  // fails when built without cpp-httplib
int run_quantize(const Commands& commands);
int run_bench_one_batch(const Commands& commands);
int run_plan(const Commands& commands);
int run_eval(const Commands& commands);

}  // namespace nibble
