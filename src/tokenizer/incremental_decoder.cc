// IncrementalDecoder: the prefix/read-offset technique of vLLM's detokenizer. Each step decodes a
// short window, ids[prefix:], and releases what it adds to the decode of its settled part,
// ids[prefix:read], so decoders that treat the start of the text specially (Strip, Metaspace) or
// merge bytes see the same neighbours as in a full decode. A chunk is only released once it no
// longer ends in U+FFFD, i.e. once its last character is complete.
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace nibble {
namespace {

bool is_continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, SkipSpecialTokens skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDecoder::push(int32_t id) {
  ids_.push_back(id);
  return advance(Stream::kOpen);
}

std::string IncrementalDecoder::flush() {
  return advance(Stream::kEnded);
}

std::string IncrementalDecoder::advance(Stream stream) {
  const std::span<const int32_t> ids(ids_);
  std::string settled =
      tokenizer_.decode(ids.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  // A settled part that decodes to nothing (skipped special tokens, a lone space that a Strip
  // decoder removes) would let start-of-text rules eat into the new text; one that starts inside
  // a character would make byte merging differ. Widen the window backwards until neither holds.
  while (prefix_offset_ > 0 && (settled.empty() || settled.starts_with(utf8::kReplacement))) {
    --prefix_offset_;
    settled = tokenizer_.decode(ids.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                                skip_special_);
  }
  const std::string text = tokenizer_.decode(ids.subspan(prefix_offset_), skip_special_);
  if (text.size() <= settled.size()) return {};
  if (stream == Stream::kOpen && text.ends_with(utf8::kReplacement))
    return {};  // a character is still open
  // `settled` is a prefix of `text` in practice; never start a chunk inside a character anyway.
  std::size_t from = settled.size();
  while (from < text.size() && is_continuation(text[from])) ++from;
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return text.substr(from);
}

}  // namespace nibble
