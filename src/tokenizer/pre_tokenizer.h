// Pre-tokenizers of tokenizer.json: Split (regex or literal, five behaviours, invert), ByteLevel,
// Metaspace and Sequence. A pre-tokenizer cuts the normalized text into pieces that BPE then
// merges independently; pieces holding an added token pass through untouched.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_context.h"
#include "tokenizer/regex.h"

namespace nibble::tok {

struct Piece {
  std::string text;
  int32_t added_id = -1;        // an added token's id: never normalized, split or merged
  bool at_input_start = false;  // starts at byte 0 of the input (Metaspace "first")
};

enum class SplitBehavior : uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

// tokenizers' NormalizedString::split: turns match spans into the [start, end) ranges to keep
// (possibly empty ones, which callers drop).
std::vector<MatchSpan> apply_split_behavior(const std::vector<MatchSpan>& spans,
                                            SplitBehavior behavior);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& json, std::string_view where,
                                                 const JsonContext& context);

}  // namespace nibble::tok
