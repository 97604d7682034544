// Added tokens of tokenizer.json ("added_tokens"): special tokens such as <s> or <|im_start|> and
// other strings that must never be split. They are cut out of the input before normalization:
// first the non-normalized ones in the raw text, then the normalized ones in the normalized text,
// each time leftmost-longest, honouring lstrip/rstrip/single_word as `tokenizers` does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"

namespace nibble::tok {

class Normalizer;

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

enum class AddedTokenSet : uint8_t { kNonNormalized, kNormalized };

class AddedVocabulary {
 public:
  // Adds the tokens in order, assigning ids as `tokenizers` does: the model's id when the vocab
  // has the content, else the next id past the model's vocab (the ids written in the file are
  // only a hint there too).
  void add(const std::vector<AddedToken>& tokens, const BpeModel& model,
           const Normalizer* normalizer);

  // Cuts the tokens of `set` out of every piece that is not an added token yet.
  void split(std::vector<Piece>& pieces, AddedTokenSet set) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  // The content (normalized, for normalized tokens) decode() uses; nullptr if `id` is not added.
  const std::string* id_to_token(int32_t id) const;
  bool is_special_content(std::string_view content) const;
  bool is_special(int32_t id) const;
  std::size_t size() const { return by_content_.size(); }
  const StringMap<int32_t>& by_content() const { return by_content_; }

 private:
  // Byte trie for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> children;
      int32_t id = -1;
    };
    std::vector<Node> nodes;
    bool first_byte[256] = {};
    void insert(std::string_view pattern, int32_t id);
    // Length of the longest pattern starting at text[pos], with its id; 0 when none.
    std::size_t longest_at(std::string_view text, std::size_t pos, int32_t& id) const;
  };
  struct Entry {
    AddedToken token;
    std::string decoded;  // content, or its normalized form for normalized tokens
  };

  void rebuild_tries();
  void split_piece(const Piece& piece, const Trie& trie, std::vector<Piece>& out) const;

  StringMap<int32_t> by_content_;
  std::unordered_map<int32_t, Entry> by_id_;
  StringMap<bool> special_contents_;
  Trie non_normalized_;
  Trie normalized_;
};

}  // namespace nibble::tok
