// The BPE model of tokenizer.json: vocab, ranked merges, byte fallback to <0xNN> tokens, unknown
// tokens (optionally fused), continuing-subword prefix / end-of-word suffix and ignore_merges.
// Merging follows `tokenizers` exactly: lowest rank first, leftmost on ties, through a heap.
// Words shorter than kMaxCachedWord bytes are cached (thread-safe), as `tokenizers` does.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_context.h"
#include "tokenizer/json_reader.h"
#include "tokenizer/string_map.h"

namespace nibble::tok {

class BpeModel {
 public:
  // `json` is the "model" object; its vocab and merges come in `tables` (see json_reader.h).
  static std::unique_ptr<BpeModel> from_json(const Json& json, BpeTables tables,
                                             std::string_view where, const JsonContext& context);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr if unknown
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    uint32_t rank = 0;
    int32_t new_id = 0;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;
  std::vector<int32_t> initial_symbols(std::string_view word) const;
  std::vector<int32_t> merge_word(std::string_view word) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // by id
  std::vector<uint8_t> has_id_;           // by id: 1 where the vocab has that id
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::vector<int32_t> byte_fallback_ids_;  // <0xNN> ids by byte, -1 where absent

  mutable std::shared_mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

}  // namespace nibble::tok
