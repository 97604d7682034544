// The `nibble` command: generate, logits, tokenize, serve. Every failure ends with one line on
// stderr ("nibble: error: ...") and exit status 1; usage errors exit with 2 (CLI11's codes
// otherwise).
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"nibble: W4A8 Mixture-of-Experts inference engine"};
  app.require_subcommand(1);
  nibble::Commands commands;
  nibble::add_commands(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return nibble::run_command(app, commands);
  } catch (const std::exception& e) {
    std::cerr << "nibble: error: " << e.what() << "\n";
    return 1;
  }
}
