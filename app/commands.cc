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
  c.serve->add_option("--max-total-tokens", s.max_total_tokens, "KV cache size in tokens")
      ->capture_default_str()->check(CLI::PositiveNumber);
  c.serve->add_option("--chunked-prefill-size", s.chunked_prefill_size, "prompt tokens per step (-1: no chunking)")
      ->capture_default_str();
}

int run_command(const CLI::App&, const Commands& c) {
  if (c.generate->parsed()) return run_generate(c);
  if (c.logits->parsed()) return run_logits(c);
  if (c.tokenize->parsed()) return run_tokenize(c);
  if (c.serve->parsed()) return run_serve(c);
  return 2;
}

}  // namespace nibble
