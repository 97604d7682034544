// `nibble tokenize`: the ids of a text as a JSON array, post-processor (BOS) applied unless told not to.
#include <iostream>

#include "commands.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

int run_tokenize(const Commands& c) {
  const Tokenizer tokenizer = Tokenizer::load(c.model.model_path);
  const auto ids = tokenizer.encode(c.text, c.no_special_tokens ? AddSpecialTokens::kNo : AddSpecialTokens::kYes);
  std::cout << '[';
  for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? ", " : "") << ids[i];
  std::cout << "]\n";
  return 0;
}

}  // namespace nibble
