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
  int64_t max_total_tokens = 16384;  // KV cache size in tokens
  int64_t chunked_prefill_size = 2048;  // prompt tokens per step; -1: no chunking
};

struct Commands {
  CLI::App* generate = nullptr;
  CLI::App* logits = nullptr;
  CLI::App* tokenize = nullptr;
  CLI::App* serve = nullptr;

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
};

void add_commands(CLI::App& app, Commands& commands);
int run_command(const CLI::App& app, const Commands& commands);

int run_generate(const Commands& commands);
int run_logits(const Commands& commands);
int run_tokenize(const Commands& commands);
int run_serve(const Commands& commands);  // fails when built without cpp-httplib

}  // namespace nibble
