// `nibble eval` tasks: data files, answer extraction, batched greedy generation, perplexity.
#include "eval_tasks.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/generator.h"

namespace nibble {
namespace {

// Calls on_line(json, line number) for each non-empty line of a JSON Lines file.
template <typename F>
void for_each_json_line(const std::filesystem::path& path, int64_t limit, F on_line) {
  std::ifstream in(path);
  check(in.good(), "cannot read ", path.string());
  std::string line;
  int64_t number = 0, taken = 0;
  while ((limit == 0 || taken < limit) && std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(path.string(), ":", number, ": not JSON (", e.what(), ")");
    }
    check(j.is_object(), path.string(), ":", number, ": not a JSON object");
    on_line(j, number);
    ++taken;
  }
  check(taken > 0, path.string(), ": no items");
}

}  // namespace

std::vector<ArithmeticProblem> read_arithmetic_problems(const std::filesystem::path& path,
                                                        int64_t limit) {
  std::vector<ArithmeticProblem> problems;
  for_each_json_line(path, limit, [&](const nlohmann::json& j, int64_t line) {
    const auto q = j.find("question");
    const auto a = j.find("answer");
    check(q != j.end() && q->is_string(), path.string(), ":", line,
          ": \"question\" must be a string");
    check(a != j.end() && a->is_number_integer(), path.string(), ":", line,
          ": \"answer\" must be an integer");
    problems.push_back({.question = q->get<std::string>(), .answer = a->get<int64_t>()});
  });
  return problems;
}

std::vector<std::string> read_texts(const std::filesystem::path& path, int64_t limit) {
  std::vector<std::string> texts;
  for_each_json_line(path, limit, [&](const nlohmann::json& j, int64_t line) {
    const auto t = j.find("text");
    check(t != j.end() && t->is_string() && !t->get<std::string>().empty(), path.string(), ":",
          line, ": \"text\" must be a non-empty string");
    texts.push_back(t->get<std::string>());
  });
  return texts;
}

std::string arithmetic_prompt(std::string_view question) {
  return cat("Question: ", question, "\nAnswer:");
}

std::optional<int64_t> final_integer(std::string_view text) {
  const auto digit = [&](std::size_t i) {
    return i < text.size() && text[i] >= '0' && text[i] <= '9';
  };
  std::optional<std::string_view> last;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t start = i;
    if (text[i] == '-' && digit(i + 1)) ++i;
    if (!digit(i)) {
      i = start + 1;
      continue;
    }
    while (digit(i)) ++i;
    last = text.substr(start, i - start);
  }
  if (!last) return std::nullopt;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(last->data(), last->data() + last->size(), value);
  if (error != std::errc() || end != last->data() + last->size()) return std::nullopt;
  return value;
}

std::vector<ArithmeticItem> run_arithmetic(Engine& engine, const Tokenizer& tokenizer,
                                           const std::vector<ArithmeticProblem>& problems,
                                           int64_t max_new_tokens, const Progress& progress) {
  const RequestParams params{
      .sampling = {}, .max_tokens = max_new_tokens, .stop_token_ids = {}, .ignore_eos = false};
  std::unordered_map<int64_t, std::size_t> index;  // request id -> problem
  for (std::size_t i = 0; i < problems.size(); ++i)
    index[engine.add_request(tokenizer.encode(arithmetic_prompt(problems[i].question)), params)] =
        i;
  std::vector<std::vector<int32_t>> tokens(problems.size());
  std::vector<ArithmeticItem> items(problems.size());
  const std::vector<int64_t>& eos = engine.model().config().eos_token_ids;
  int64_t done = 0, correct = 0;
  while (engine.has_unfinished()) {
    for (const StepOutput& out : engine.step()) {
      const std::size_t i = index.at(out.id);
      const bool stop = out.reason == FinishReason::kStop &&
                        std::find(eos.begin(), eos.end(), int64_t{out.token}) != eos.end();
      if (!stop) tokens[i].push_back(out.token);
      if (!out.finished) continue;
      ArithmeticItem& item = items[i];
      item.generated = tokenizer.decode(tokens[i]);
      item.prediction = final_integer(item.generated);
      item.correct = item.prediction == problems[i].answer;
      item.generated_tokens = out.generated_tokens;
      correct += item.correct;
      ++done;
      if (progress)
        progress(done, static_cast<int64_t>(problems.size()),
                 static_cast<double>(correct) / static_cast<double>(done));
    }
  }
  check(done == static_cast<int64_t>(problems.size()), "eval: ", problems.size() - done,
        " requests did not finish");
  return items;
}

std::vector<PassageScore> run_perplexity(Model& model, KvCacheDType kv_dtype,
                                         const Tokenizer& tokenizer,
                                         const std::vector<std::string>& texts,
                                         const Progress& progress) {
  const int64_t context = model.config().max_position_embeddings;
  std::vector<PassageScore> scores;
  double nll = 0.0;
  int64_t scored = 0;
  for (std::size_t p = 0; p < texts.size(); ++p) {
    const std::vector<int32_t> ids = tokenizer.encode(texts[p]);
    const auto n = static_cast<int64_t>(ids.size());
    check(n >= 2, "eval: text ", p + 1, " has fewer than two tokens");
    check(n <= context, "eval: text ", p + 1, " has ", n,
          " tokens, more than the model's context of ", context);
    Generator generator(model, n, kv_dtype);
    const Tensor logits = generator.extend(ids, n);  // (n, vocab) float32 on the CPU
    const int64_t vocab = logits.dim(1);
    const float* rows = logits.data<float>();
    PassageScore score{.tokens = n - 1, .nll = 0.0};
    for (int64_t t = 0; t + 1 < n; ++t) {  // row t predicts ids[t + 1]
      const float* row = rows + t * vocab;
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t v = 0; v < vocab; ++v) max = std::max(max, double{row[v]});
      double sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double{row[v]} - max);
      score.nll += max + std::log(sum) - double{row[ids[t + 1]]};
    }
    scores.push_back(score);
    nll += score.nll;
    scored += score.tokens;
    if (progress)
      progress(static_cast<int64_t>(p) + 1, static_cast<int64_t>(texts.size()),
               std::exp(nll / static_cast<double>(scored)));
  }
  return scores;
}

}  // namespace nibble
