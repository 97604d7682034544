// Normalizers of tokenizer.json: NFC/NFD/NFKC/NFKD (ICU), Prepend, Replace, Strip, Lowercase,
// ByteLevel and Sequence. They run on the text between added tokens, after those are split out.
// Other types (BertNormalizer, Precompiled, ...) are refused at load.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_context.h"

namespace nibble::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// `json` is the "normalizer" value (null gives nullptr); `where` is its JSON path for errors.
std::unique_ptr<Normalizer> make_normalizer(const Json& json, std::string_view where,
                                            const JsonContext& context);

}  // namespace nibble::tok
