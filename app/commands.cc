// Flags of each subcommand (names follow SGLang) and dispatch.
#include "commands.h"

namespace nibble {

void add_commands(CLI::App& app, Commands& c) {
  c.generate = app.add_subcommand("generate", "generate text from a prompt");
  add_model_options(*c.generate, c.model);
  c.generate->add_option("--prompt", c.prompt, "prompt text")->required();
  c.generate->add_option("--max-new-tokens", c.max_new_tokens, "tokens to generate")->capture_default_str();
  c.generate->add_option("--temperature", c.temperature, "0 for greedy")->capture_default_str();
  c.generate->add_option("--top-p", c.top_p, "nucleus sampling mass")->capture_default_str();
  c.generate->add_option("--top-k", c.top_k, "0 for no limit")->capture_default_str();
  c.generate->add_option("--seed", c.seed, "sampling seed")->capture_default_str();
  c.generate->add_flag("--ignore-eos", c.ignore_eos, "keep generating after end-of-sequence tokens");

  c.logits = app.add_subcommand("logits", "write float32 [T, vocab] logits of a token sequence to .npy");
  add_model_options(*c.logits, c.model);
  c.logits->add_option("--ids", c.ids, "comma-separated token ids, e.g. 1,415,9")->required();
  c.logits->add_option("--out", c.out, "output .npy file")->required();

  c.tokenize = app.add_subcommand("tokenize", "print the token ids of a text as a JSON array");
  c.tokenize->add_option("--model-path", c.model.model_path, "model directory with tokenizer.json")->required();
  c.tokenize->add_option("--text", c.text, "text to tokenize")->required();
  c.tokenize->add_flag("--no-special-tokens", c.no_special_tokens, "do not apply the post-processor (BOS)");

  QuantizeOptions& q = c.quantize_options;
  c.quantize = app.add_subcommand("quantize", "write a pre-quantized W4A8KV8 checkpoint (AMD Quark's format)");
  c.quantize->add_option("--model-path", c.model.model_path, "bf16 model directory (config.json, *.safetensors)")
      ->required();
  c.quantize->add_option("--output", q.output, "directory to write (new or empty)")->required();
  c.quantize->add_option("--quantization", q.quantization, "quark_int4fp8_moe or fp8")->capture_default_str();
  c.quantize->add_option("--max-shard-size", q.max_shard_size, "largest shard, e.g. 5GB or 500MB")
      ->capture_default_str();

  ServeOptions& s = c.serve_options;
  c.serve = app.add_subcommand("serve", "serve the OpenAI-compatible HTTP API");
  add_model_options(*c.serve, c.model);
  c.serve->add_option("--host", s.host, "address to listen on")->capture_default_str();
  c.serve->add_option("--port", s.port, "port to listen on (0: any free port)")
      ->capture_default_str()->check(CLI::Range(0, 65535));
  c.serve->add_option("--api-key", s.api_key, "require \"Authorization: Bearer KEY\" on /v1/ routes");
  c.serve->add_option("--served-model-name", s.served_model_name, "model name in the API (default: --model-path)");
  c.serve->add_option("--max-running-requests", s.max_running_requests, "requests decoding at once")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c.serve->add_option("--chunked-prefill-size", s.chunked_prefill_size, "prompt tokens per step (-1: no chunking)")
      ->capture_default_str();

  BenchOptions& b = c.bench;
  c.bench_one_batch = app.add_subcommand("bench-one-batch", "latency of one static batch: prefill, then decode steps");
  add_model_options(*c.bench_one_batch, c.model);
  c.bench_one_batch->add_option("--batch-size", b.batch_size, "sequences in the batch")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c.bench_one_batch->add_option("--input-len", b.input_len, "prompt tokens per sequence")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c.bench_one_batch->add_option("--output-len", b.output_len, "tokens generated per sequence")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c.bench_one_batch->add_option("--json", b.json, "write the results to this file as JSON");
  c.bench_one_batch->add_option("--run-name", b.run_name, "name of the run in the JSON")->capture_default_str();
  c.bench_one_batch->add_option("--seed", b.seed, "seed of the random prompts")->capture_default_str();

  c.plan = app.add_subcommand("plan", "memory per GPU of a model at a quantization and --tp-size, without loading it");
  c.plan->add_option("--model-path", c.model.model_path, "model directory (config.json)")->required();
  c.plan->add_option("--quantization", c.model.quantization, "auto, none, fp8 or quark_int4fp8_moe")
      ->capture_default_str();
  c.plan->add_option("--kv-cache-dtype", c.model.kv_cache_dtype, "auto, bf16 or fp8_e4m3")->capture_default_str();
  c.plan->add_option("--tp-size", c.model.tp_size, "tensor-parallel size (GPUs)")->capture_default_str();
  c.plan->add_option("--gpu-memory-gb", c.plan_options.gpu_memory_gb, "memory of one GPU in GB (2^30 bytes); default: an H200")
      ->capture_default_str();
  c.plan->add_option("--mem-fraction-static", c.model.mem_fraction_static, "share of the memory for weights and KV cache")
      ->capture_default_str();
  c.plan->add_option("--max-total-tokens", c.model.max_total_tokens, "KV cache tokens that must fit as well");

  EvalOptions& e = c.eval_options;
  c.eval = app.add_subcommand("eval", "accuracy on held-out arithmetic problems or perplexity on held-out prose");
  add_model_options(*c.eval, c.model);
  c.eval->add_option("--task", e.task, "arithmetic or perplexity")->required();
  c.eval->add_option("--data", e.data, "JSON Lines file (default: MODEL_PATH/eval/arithmetic.jsonl or prose.jsonl)");
  c.eval->add_option("--limit", e.limit, "evaluate the first N items (0: all)")->capture_default_str();
  c.eval->add_option("--max-new-tokens", e.max_new_tokens, "arithmetic: tokens generated per answer at most")
      ->capture_default_str();
  c.eval->add_option("--max-running-requests", e.max_running_requests, "arithmetic: requests decoding at once")
      ->capture_default_str();
  c.eval->add_option("--details", e.details, "write one JSON line per item to this file");
}

int run_command(const CLI::App&, const Commands& c) {
  if (c.generate->parsed()) return run_generate(c);
  if (c.logits->parsed()) return run_logits(c);
  if (c.tokenize->parsed()) return run_tokenize(c);
  if (c.serve->parsed()) return run_serve(c);
  if (c.quantize->parsed()) return run_quantize(c);
  if (c.bench_one_batch->parsed()) return run_bench_one_batch(c);
  if (c.plan->parsed()) return run_plan(c);
  if (c.eval->parsed()) return run_eval(c);
  return 2;
}

}  // namespace nibble
