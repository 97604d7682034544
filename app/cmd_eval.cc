// `nibble eval`: accuracy on held-out arithmetic word problems (greedy, batched through the engine,
// exact match of the final integer) or perplexity on held-out prose (teacher-forced logits), with
// the usual model flags. Progress on stderr; one JSON summary on stdout; per-item results with
// --details.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "eval_tasks.h"

namespace nibble {
namespace {

constexpr int64_t kBlockSize = 16;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Progress on stderr about every 2 seconds and at the end: items done and the figure so far.
Progress progress_printer(const std::string& task, const std::string& figure,
                          Clock::time_point start) {
  auto last = std::make_shared<Clock::time_point>(start);
  return [=](int64_t done, int64_t total, double value) {
    if (done < total && seconds_since(*last) < 2.0) return;
    *last = Clock::now();
    std::cerr << "eval " << task << ": " << done << "/" << total << ", " << figure << " " << value
              << ", " << seconds_since(start) << " s\n";
  };
}

std::filesystem::path default_data(const EvalOptions& e, const ModelOptions& m) {
  if (!e.data.empty()) return e.data;
  return std::filesystem::path(m.model_path) / "eval" /
         (e.task == "arithmetic" ? "arithmetic.jsonl" : "prose.jsonl");
}

nlohmann::json run_arithmetic_task(const EvalOptions& e, const ModelOptions& m,
                                   const std::filesystem::path& data, std::ofstream* details) {
  const std::vector<ArithmeticProblem> problems = read_arithmetic_problems(data, e.limit);
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir(m));
  LoadedModel loaded = load_model(m);
  int64_t longest = 0;
  for (const ArithmeticProblem& p : problems)
    longest = std::max<int64_t>(
        longest, static_cast<int64_t>(tokenizer.encode(arithmetic_prompt(p.question)).size()));
  const int64_t running =
      std::min<int64_t>(e.max_running_requests, static_cast<int64_t>(problems.size()));
  const int64_t chunk = 2048;
  const int64_t tokens =
      kv_cache_tokens(loaded, m,
                      {.block_size = kBlockSize,
                       .largest_step_tokens = chunk,
                       .max_logit_rows = running,
                       .want_tokens = running * (longest + e.max_new_tokens + kBlockSize),
                       .min_tokens = longest + e.max_new_tokens + kBlockSize});
  Engine engine(*loaded.model,
                {.num_blocks = tokens / kBlockSize,
                 .block_size = kBlockSize,
                 .kv_dtype = loaded.kv_dtype,
                 .scheduler = {.max_running = running, .max_batched_tokens = chunk},
                 .cuda_graphs = m.cuda_graphs()});
  int64_t correct = 0;
  const auto start = Clock::now();
  const std::vector<ArithmeticItem> items =
      run_arithmetic(engine, tokenizer, problems, e.max_new_tokens,
                     progress_printer("arithmetic", "accuracy", start));
  const double seconds = seconds_since(start);
  int64_t generated = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    correct += items[i].correct;
    generated += items[i].generated_tokens;
    if (details)
      *details << nlohmann::json{{"index", i},
                                 {"question", problems[i].question},
                                 {"answer", problems[i].answer},
                                 {"prediction", items[i].prediction
                                                    ? nlohmann::json(*items[i].prediction)
                                                    : nullptr},
                                 {"correct", items[i].correct},
                                 {"generated", items[i].generated}}
                      .dump()
               << "\n";
  }
  const auto n = static_cast<int64_t>(items.size());
  return {{"task", "arithmetic"},
          {"n", n},
          {"correct", correct},
          {"accuracy", static_cast<double>(correct) / static_cast<double>(n)},
          {"generated_tokens", generated},
          {"seconds", seconds},
          {"quantization", quantization_name(loaded.quantization)},
          {"kv_cache_dtype", loaded.kv_dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3" : "bf16"}};
}

nlohmann::json run_perplexity_task(const EvalOptions& e, const ModelOptions& m,
                                   const std::filesystem::path& data, std::ofstream* details) {
  const std::vector<std::string> texts = read_texts(data, e.limit);
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir(m));
  LoadedModel loaded = load_model(m);
  const auto start = Clock::now();
  const std::vector<PassageScore> scores =
      run_perplexity(*loaded.model, loaded.kv_dtype, tokenizer, texts,
                     progress_printer("perplexity", "perplexity", start));
  const double seconds = seconds_since(start);
  int64_t tokens = 0;
  double nll = 0.0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    tokens += scores[i].tokens;
    nll += scores[i].nll;
    if (details)
      *details << nlohmann::json{{"index", i}, {"tokens", scores[i].tokens}, {"nll", scores[i].nll}}
                      .dump()
               << "\n";
  }
  const double mean = nll / static_cast<double>(tokens);
  return {{"task", "perplexity"},
          {"n", static_cast<int64_t>(scores.size())},
          {"tokens", tokens},
          {"nll_per_token", mean},
          {"perplexity", std::exp(mean)},
          {"seconds", seconds},
          {"quantization", quantization_name(loaded.quantization)},
          {"kv_cache_dtype", loaded.kv_dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3" : "bf16"}};
}

}  // namespace

int run_eval(const Commands& c) {
  const EvalOptions& e = c.eval_options;
  check(e.task == "arithmetic" || e.task == "perplexity",
        "--task must be arithmetic or perplexity, got \"", e.task, "\"");
  check(e.limit >= 0, "--limit must be 0 (all) or positive, got ", e.limit);
  check(e.max_new_tokens >= 1, "--max-new-tokens must be positive, got ", e.max_new_tokens);
  check(e.max_running_requests >= 1, "--max-running-requests must be positive, got ",
        e.max_running_requests);
  check(std::filesystem::is_directory(c.model.model_path), "model directory ", c.model.model_path,
        " does not exist");
  const std::filesystem::path data = default_data(e, c.model);
  check(std::filesystem::is_regular_file(data), "eval data ", data.string(), " does not exist");
  std::ofstream details_file;
  if (!e.details.empty()) {
    details_file.open(e.details);
    check(details_file.good(), "cannot write ", e.details);
  }
  std::ofstream* details = e.details.empty() ? nullptr : &details_file;
  nlohmann::json summary = e.task == "arithmetic" ? run_arithmetic_task(e, c.model, data, details)
                                                  : run_perplexity_task(e, c.model, data, details);
  summary["model_path"] = c.model.model_path;
  summary["data"] = data.string();
  summary["device"] = c.model.device;
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace nibble
