// The pieces of a loaded Tokenizer (internal to src/tokenizer): the pipeline of `tokenizers`,
// added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor, and the decoder chain.
#pragma once

#include <memory>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace nibble {

struct Tokenizer::Impl {
  std::unique_ptr<tok::Normalizer> normalizer;       // may be null
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<tok::BpeModel> model;
  tok::AddedVocabulary added;
  std::unique_ptr<tok::PostProcessor> post_processor;  // may be null
  std::unique_ptr<tok::Decoder> decoder;               // may be null: tokens joined by spaces
  int64_t vocab_size = 0;

  static std::unique_ptr<Impl> from_json_file(const std::filesystem::path& file);
};

}  // namespace nibble
