// Added-token matching and id assignment (see added_vocabulary.h).
#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

// Start of the run of whitespace that ends at `end`.
std::size_t whitespace_run_start(std::string_view s, std::size_t end) {
  while (end > 0) {
    std::size_t start = 0;
    if (!utf8::is_whitespace(utf8::last_char(s.substr(0, end), &start))) break;
    end = start;
  }
  return end;
}

// Byte length of the run of whitespace that starts at `begin`.
std::size_t whitespace_run_len(std::string_view s, std::size_t begin) {
  std::size_t pos = begin;
  while (pos < s.size()) {
    std::size_t next = pos;
    if (!utf8::is_whitespace(utf8::next_char(s, next))) break;
    pos = next;
  }
  return pos - begin;
}

bool word_char_before(std::string_view s, std::size_t at) {
  return at > 0 && utf8::is_word_char(utf8::last_char(s.substr(0, at)));
}

bool word_char_at(std::string_view s, std::size_t at) {
  if (at >= s.size()) return false;
  return utf8::is_word_char(utf8::next_char(s, at));
}

bool same_flags(const AddedToken& a, const AddedToken& b) {
  return a.content == b.content && a.single_word == b.single_word && a.lstrip == b.lstrip &&
         a.rstrip == b.rstrip && a.normalized == b.normalized && a.special == b.special;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view pattern, int32_t id) {
  if (nodes.empty()) nodes.emplace_back();
  uint32_t node = 0;
  for (const char ch : pattern) {
    const auto b = static_cast<unsigned char>(ch);
    auto& children = nodes[node].children;
    const auto it = std::find_if(children.begin(), children.end(),
                                 [b](const auto& child) { return child.first == b; });
    if (it != children.end()) {
      node = it->second;
    } else {
      const auto child = static_cast<uint32_t>(nodes.size());
      nodes[node].children.emplace_back(b, child);
      nodes.emplace_back();
      node = child;
    }
  }
  nodes[node].id = id;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
}

std::size_t AddedVocabulary::Trie::longest_at(std::string_view text, std::size_t pos,
                                              int32_t& id) const {
  std::size_t best = 0;
  uint32_t node = 0;
  for (std::size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const auto& children = nodes[node].children;
    const auto it = std::find_if(children.begin(), children.end(),
                                 [b](const auto& child) { return child.first == b; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes[node].id >= 0) {
      best = i + 1 - pos;
      id = nodes[node].id;
    }
  }
  return best;
}

void AddedVocabulary::add(const std::vector<AddedToken>& tokens, const BpeModel& model,
                          const Normalizer* normalizer) {
  auto next_id = static_cast<int32_t>(model.size());
  for (const auto& [id, entry] : by_id_) next_id = std::max(next_id, id + 1);
  for (const AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    if (const auto it = by_content_.find(token.content); it != by_content_.end()) {
      if (same_flags(by_id_.at(it->second).token, token)) continue;
    }
    int32_t id = 0;
    if (const auto existing = token_to_id(token.content)) {
      id = *existing;
    } else if (const auto in_model = model.token_to_id(token.content)) {
      id = *in_model;
    } else {
      id = next_id++;
    }
    std::string decoded = token.content;
    if (token.normalized && normalizer != nullptr) decoded = normalizer->normalize(decoded);
    by_content_[token.content] = id;
    if (token.special) special_contents_[token.content] = true;
    by_id_[id] = Entry{token, std::move(decoded)};
  }
  rebuild_tries();
}

void AddedVocabulary::rebuild_tries() {
  non_normalized_ = Trie();
  normalized_ = Trie();
  for (const auto& [id, entry] : by_id_) {
    if (entry.token.normalized) {
      if (!entry.decoded.empty()) normalized_.insert(entry.decoded, id);
    } else {
      non_normalized_.insert(entry.token.content, id);
    }
  }
}

void AddedVocabulary::split(std::vector<Piece>& pieces, AddedTokenSet set) const {
  const Trie& trie = set == AddedTokenSet::kNormalized ? normalized_ : non_normalized_;
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0 || trie.nodes.empty()) {
      if (!piece.text.empty()) out.push_back(std::move(piece));
    } else {
      split_piece(piece, trie, out);
    }
  }
  pieces = std::move(out);
}

void AddedVocabulary::split_piece(const Piece& piece, const Trie& trie,
                                  std::vector<Piece>& out) const {
  const std::string_view s = piece.text;
  const auto emit_text = [&](std::size_t begin, std::size_t end) {
    if (end > begin) {
      out.push_back(
          Piece{std::string(s.substr(begin, end - begin)), -1, piece.at_input_start && begin == 0});
    }
  };
  std::size_t start_offset = 0;  // end of what has been emitted
  std::size_t pos = 0;           // where matching resumes: matches never overlap
  while (pos < s.size()) {
    int32_t id = -1;
    const std::size_t len =
        trie.first_byte[static_cast<unsigned char>(s[pos])] ? trie.longest_at(s, pos, id) : 0;
    if (len == 0) {
      ++pos;
      continue;
    }
    std::size_t start = pos;
    std::size_t stop = pos + len;
    pos = stop;
    const AddedToken& token = by_id_.at(id).token;
    if (token.single_word && (word_char_before(s, start) || word_char_at(s, stop))) continue;
    if (token.lstrip) start = std::max(whitespace_run_start(s, start), start_offset);
    if (token.rstrip) stop += whitespace_run_len(s, stop);
    if (start_offset < start) emit_text(start_offset, start);
    out.push_back(Piece{std::string(s.substr(start, stop - start)), id, false});
    start_offset = stop;
  }
  if (start_offset < s.size()) emit_text(start_offset, s.size());
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.decoded;
}

bool AddedVocabulary::is_special_content(std::string_view content) const {
  return special_contents_.find(content) != special_contents_.end();
}

bool AddedVocabulary::is_special(int32_t id) const {
  const auto it = by_id_.find(id);
  return it != by_id_.end() && it->second.token.special;
}

}  // namespace nibble::tok
