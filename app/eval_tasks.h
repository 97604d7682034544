// The two `nibble eval` tasks on a loaded model. arithmetic: greedy answers to word problems
// through the continuous-batching engine, scored by exact match of the last integer in the
// generated text (the demo model's answer format, tools/make_demo_corpus.py). perplexity:
// teacher-forced logits of held-out passages through the logits path. Data files are JSON Lines;
// see read_* below.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct ArithmeticProblem {
  std::string question;
  int64_t answer = 0;
};

// {"question": str, "answer": int, ...} per line; the first `limit` (0: all). Fails naming
// file:line.
std::vector<ArithmeticProblem> read_arithmetic_problems(const std::filesystem::path& path,
                                                        int64_t limit);
// {"text": str, ...} per line; the first `limit` (0: all).
std::vector<std::string> read_texts(const std::filesystem::path& path, int64_t limit);

// "Question: <question>\nAnswer:" — what the model continues (a BOS goes before it).
std::string arithmetic_prompt(std::string_view question);
// The last integer (-?[0-9]+, leftmost-first like Python's re.findall) in `text`; none when there
// is none or it does not fit in int64.
std::optional<int64_t> final_integer(std::string_view text);

struct ArithmeticItem {
  std::string generated;  // decoded, special tokens skipped
  std::optional<int64_t> prediction;
  bool correct = false;
  int64_t generated_tokens = 0;
};

// Called after each finished item with (items done, items in all, the figure so far: accuracy or
// perplexity over the items done).
using Progress = std::function<void(int64_t, int64_t, double)>;

// Greedy generation of every problem's answer (at most max_new_tokens, stopping at EOS), all queued
// on `engine` at once. Items come back in the problems' order.
std::vector<ArithmeticItem> run_arithmetic(Engine& engine, const Tokenizer& tokenizer,
                                           const std::vector<ArithmeticProblem>& problems,
                                           int64_t max_new_tokens, const Progress& progress);

struct PassageScore {
  int64_t tokens = 0;  // tokens scored: every token after the first (BOS)
  double nll = 0.0;    // sum over them of -log p(token | the tokens before), natural log
};

// Each text encoded with BOS; logits of every position in one forward pass (max_position_embeddings
// tokens at most: longer texts fail).
std::vector<PassageScore> run_perplexity(Model& model, KvCacheDType kv_dtype,
                                         const Tokenizer& tokenizer,
                                         const std::vector<std::string>& texts,
                                         const Progress& progress);

}  // namespace nibble
