// Detokenizer then stop matcher.
#include "server/output_text.h"

namespace nibble {

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t min_tokens)
    : decoder_(tokenizer), stop_(std::move(stop)), min_tokens_(min_tokens) {}

std::string OutputText::push(int32_t token) {
  if (stopped()) return {};
  ++num_tokens_;
  std::string text = decoder_.push(token);
  return num_tokens_ <= min_tokens_ ? text : stop_.push(text).text;
}

void OutputText::count_hidden() {
  if (!stopped()) ++num_tokens_;
}

std::string OutputText::finish() {
  if (stopped()) return {};
  std::string text = stop_.push(decoder_.flush()).text;
  return text + stop_.flush();
}

}  // namespace nibble
