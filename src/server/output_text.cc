// Detokenizer then stop matcher.
#include "server/output_text.h"

namespace nibble {

OutputText::OutputText(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : decoder_(tokenizer), stop_(std::move(stop)) {}

std::string OutputText::push(int32_t token) {
  if (stopped()) return {};
  ++num_tokens_;
  return stop_.push(decoder_.push(token)).text;
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
