// Streaming read of tokenizer.json. model.vocab and model.merges (hundreds of thousands of
// entries) go straight into the BPE tables instead of nlohmann's DOM, which would cost a few
// hundred milliseconds more to build and destroy; everything else becomes an ordinary Json DOM.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/json_context.h"
#include "tokenizer/string_map.h"

namespace nibble::tok {

struct BpeTables {
  std::optional<StringMap<int32_t>> vocab;  // model.vocab when it is an object
  // model.merges when it is an array, "a b" entries already split ("#version" lines dropped).
  std::optional<std::vector<std::pair<std::string, std::string>>> merges;
};

struct TokenizerJson {
  Json root;  // without model.vocab / model.merges when those were captured into `bpe`
  BpeTables bpe;
};

// Throws nibble::Error naming `context.file` for invalid JSON or malformed vocab/merges entries.
TokenizerJson parse_tokenizer_json(const std::string& text, const JsonContext& context);

}  // namespace nibble::tok
