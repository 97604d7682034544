// Subcommand registration and dispatch for the `nibble` command.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "model_options.h"

namespace nibble {

struct Commands {
  CLI::App* generate = nullptr;
  CLI::App* logits = nullptr;
  CLI::App* tokenize = nullptr;

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
};

void add_commands(CLI::App& app, Commands& commands);
int run_command(const CLI::App& app, const Commands& commands);

int run_generate(const Commands& commands);
int run_logits(const Commands& commands);
int run_tokenize(const Commands& commands);

}  // namespace nibble
