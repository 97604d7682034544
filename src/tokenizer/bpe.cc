// BPE model loading and word merging (see bpe.h).
#include "tokenizer/bpe.h"

#include <mutex>
#include <queue>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

constexpr std::size_t kMaxCachedWord = 256;      // bytes, as `tokenizers`
constexpr std::size_t kCacheCapacity = 1 << 16;  // words; past it, new words are not cached

std::string byte_token(unsigned b) {
  constexpr char kHex[] = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

// A merge candidate in the heap: lowest rank first, then leftmost.
struct Candidate {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
  bool operator<(const Candidate& other) const {  // "lower priority than"
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

std::unique_ptr<BpeModel> BpeModel::from_json(const Json& json, BpeTables tables,
                                              std::string_view where, const JsonContext& context) {
  auto model = std::make_unique<BpeModel>();
  if (json.contains("dropout") && !json["dropout"].is_null()) {
    const Json& dropout = json["dropout"];
    if (!dropout.is_number() || dropout.get<double>() != 0.0) {
      context.fail_at(path_join(where, "dropout"),
                      "BPE dropout is not supported (it makes encoding random)");
    }
  }
  const auto optional_string = [&](const char* key) -> std::optional<std::string> {
    if (!json.contains(key) || json[key].is_null()) return std::nullopt;
    return context.string_member(json, key, where);
  };
  model->unk_token_ = optional_string("unk_token");
  model->continuing_subword_prefix_ = optional_string("continuing_subword_prefix").value_or("");
  model->end_of_word_suffix_ = optional_string("end_of_word_suffix").value_or("");
  model->fuse_unk_ = context.bool_member(json, "fuse_unk", where, false);
  model->byte_fallback_ = context.bool_member(json, "byte_fallback", where, false);
  model->ignore_merges_ = context.bool_member(json, "ignore_merges", where, false);

  if (!tables.vocab) {
    context.member(json, "vocab", where);  // fails if absent
    context.fail_at(path_join(where, "vocab"), "expected an object of token -> id");
  }
  if (!tables.merges) {
    context.member(json, "merges", where);
    context.fail_at(path_join(where, "merges"), "expected an array");
  }
  model->vocab_ = std::move(*tables.vocab);
  int32_t max_id = -1;
  for (const auto& [token, id] : model->vocab_) max_id = std::max(max_id, id);
  model->id_to_token_.resize(static_cast<std::size_t>(max_id) + 1);
  model->has_id_.assign(static_cast<std::size_t>(max_id) + 1, 0);
  for (const auto& [token, id] : model->vocab_) {
    model->id_to_token_[static_cast<std::size_t>(id)] = token;
    model->has_id_[static_cast<std::size_t>(id)] = 1;
  }
  model->byte_fallback_ids_.assign(256, -1);
  for (unsigned b = 0; b < 256; ++b) {
    if (auto id = model->token_to_id(byte_token(b))) model->byte_fallback_ids_[b] = *id;
  }

  const std::string merges_at = path_join(where, "merges");
  const auto& merges = *tables.merges;
  model->merges_.reserve(merges.size());
  const std::size_t prefix_len = model->continuing_subword_prefix_.size();
  std::string merged;
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const auto& [left, right] = merges[i];
    const auto left_id = model->token_to_id(left);
    const auto right_id = model->token_to_id(right);
    if (!left_id || !right_id || right.size() < prefix_len) {
      context.fail_at(path_index(merges_at, i),
                      cat("merge of tokens not in the vocab: \"", left, "\" \"", right, "\""));
    }
    merged.assign(left);
    merged.append(std::string_view(right).substr(prefix_len));
    const auto new_id = model->token_to_id(merged);
    if (!new_id) {
      context.fail_at(path_index(merges_at, i),
                      cat("merged token \"", merged, "\" is not in the vocab"));
    }
    // A later duplicate overrides an earlier one, as in `tokenizers`.
    model->merges_[pair_key(*left_id, *right_id)] = Merge{static_cast<uint32_t>(i), *new_id};
  }
  return model;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= has_id_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[static_cast<std::size_t>(id)];
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// One symbol per character (with prefix/suffix where configured), byte-fallback tokens or
// (fused) unknown tokens for characters the vocab lacks.
std::vector<int32_t> BpeModel::initial_symbols(std::string_view word) const {
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  std::optional<int32_t> pending_unk;
  std::string piece;
  std::size_t pos = 0;
  while (pos < word.size()) {
    const std::size_t start = pos;
    pos += utf8::char_len(static_cast<unsigned char>(word[pos]));
    piece.clear();
    if (start != 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(start, pos - start));
    if (pos == word.size()) piece += end_of_word_suffix_;

    if (const auto id = token_to_id(piece)) {
      if (pending_unk) symbols.push_back(*std::exchange(pending_unk, std::nullopt));
      symbols.push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char b : piece)
        all = all && byte_fallback_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        // tokenizers leaves a pending unknown token in place here and adds it after.
        for (const char b : piece)
          symbols.push_back(byte_fallback_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    if (!unk_token_) continue;  // no unknown token: the character is dropped, as in tokenizers
    const auto unk = token_to_id(*unk_token_);
    check(unk.has_value(), "tokenizer: unk_token \"", *unk_token_, "\" is not in the vocab");
    if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
    pending_unk = *unk;
  }
  if (pending_unk) symbols.push_back(*pending_unk);
  return symbols;
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<int32_t> ids = initial_symbols(word);
  const std::size_t n = ids.size();
  std::vector<int32_t> prev(n);
  std::vector<int32_t> next(n);
  std::vector<uint8_t> alive(n, 1);
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    if (i + 1 < n) {
      if (const Merge* m = find_merge(ids[i], ids[i + 1])) {
        heap_storage.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
      }
    }
  }
  std::priority_queue<Candidate> heap(std::less<Candidate>(), std::move(heap_storage));
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const auto right = static_cast<uint32_t>(next[top.pos]);
    // Skip stale candidates: the pair at this position changed since it was queued.
    const Merge* current = find_merge(ids[top.pos], ids[right]);
    if (current == nullptr || current->new_id != top.new_id) continue;
    ids[top.pos] = top.new_id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[static_cast<uint32_t>(next[right])] = static_cast<int32_t>(top.pos);
    if (prev[top.pos] >= 0) {
      const auto p = static_cast<uint32_t>(prev[top.pos]);
      if (const Merge* m = find_merge(ids[p], ids[top.pos])) heap.push({m->rank, p, m->new_id});
    }
    if (next[top.pos] >= 0) {
      const auto q = static_cast<uint32_t>(next[top.pos]);
      if (const Merge* m = find_merge(ids[top.pos], ids[q]))
        heap.push({m->rank, top.pos, m->new_id});
    }
  }
  std::vector<int32_t> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (alive[i]) out.push_back(ids[i]);
  }
  return out;
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() < kMaxCachedWord;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace nibble::tok
