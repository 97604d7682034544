// Decoders of tokenizer.json, turning token strings back into text: ByteLevel, ByteFallback,
// Fuse, Strip, Replace, Metaspace and Sequence (WordPiece, CTC and BPEDecoder are refused at
// load). Each step maps a list of strings to a list of strings; decode() joins the result.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_context.h"

namespace nibble::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> make_decoder(const Json& json, std::string_view where,
                                      const JsonContext& context);

}  // namespace nibble::tok
