// Tokenizer: encode (added tokens, normalizer, pre-tokenizer, BPE, post-processor) and decode
// (decoder chain) over the components built by load.cc.
#include "tokenizer/tokenizer.h"

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace nibble {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, AddSpecialTokens add_special) const {
  if (const auto bad = utf8::first_invalid(text)) {
    fail("tokenizer: the text to encode is not valid UTF-8 (at byte ", *bad, ")");
  }
  std::vector<tok::Piece> pieces;
  if (!text.empty()) pieces.push_back(tok::Piece{std::string(text), -1, true});
  impl_->added.split(pieces, tok::AddedTokenSet::kNonNormalized);
  if (impl_->normalizer != nullptr) {
    for (tok::Piece& piece : pieces) {
      if (piece.added_id < 0) piece.text = impl_->normalizer->normalize(std::move(piece.text));
    }
  }
  impl_->added.split(pieces, tok::AddedTokenSet::kNormalized);  // also drops emptied pieces
  if (impl_->pre_tokenizer != nullptr) impl_->pre_tokenizer->pre_tokenize(pieces);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const tok::Piece& piece : pieces) {
    if (piece.added_id >= 0) {
      ids.push_back(piece.added_id);
    } else {
      impl_->model->tokenize(piece.text, ids);
    }
  }
  if (add_special == AddSpecialTokens::kYes && impl_->post_processor != nullptr) {
    impl_->post_processor->process(ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, SkipSpecialTokens skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    const std::string* token = impl_->added.id_to_token(id);
    if (token == nullptr) token = impl_->model->id_to_token(id);
    if (token == nullptr) continue;  // unknown ids are dropped, as in `tokenizers`
    // Like `tokenizers`, "special" is decided on the token's text.
    if (skip_special == SkipSpecialTokens::kYes && impl_->added.is_special_content(*token)) {
      continue;
    }
    tokens.push_back(*token);
  }
  std::string text;
  if (impl_->decoder == nullptr) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  impl_->decoder->decode_chain(tokens);
  for (const std::string& token : tokens) text += token;
  return text;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->added.id_to_token(id);
  if (token == nullptr) token = impl_->model->id_to_token(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->added.is_special(id);
}

}  // namespace nibble
