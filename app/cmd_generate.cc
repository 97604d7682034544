// `nibble generate`: tokenize the prompt, prefill, decode, stream the text to stdout.
#include <chrono>
#include <iostream>

#include "commands.h"
#include "engine/generator.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

int run_generate(const Commands& c) {
  const SamplingParams sampling{.temperature = c.temperature, .top_p = c.top_p, .top_k = c.top_k, .seed = c.seed};
  validate(sampling);
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_dir(c.model));
  LoadedModel loaded = load_model(c.model);
  const std::vector<int32_t> prompt = tokenizer.encode(c.prompt);
  std::vector<int64_t> stop_ids;
  if (!c.ignore_eos) stop_ids = loaded.model->config().eos_token_ids;

  IncrementalDecoder decoder(tokenizer);
  std::cout << c.prompt << std::flush;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> out =
      generate(*loaded.model, prompt, c.max_new_tokens, sampling, loaded.kv_dtype, stop_ids,
               [&](int32_t id) { std::cout << decoder.push(id) << std::flush; });
  std::cout << decoder.flush() << "\n";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "prompt " << prompt.size() << " tokens, generated " << out.size() << " tokens in " << seconds
            << " s (" << static_cast<double>(out.size()) / seconds << " tokens/s)\n";
  return 0;
}

}  // namespace nibble
