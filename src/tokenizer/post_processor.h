// Post-processors of tokenizer.json, run by encode() with AddSpecialTokens::kYes:
// TemplateProcessing (its "single" template, e.g. `<s> $A`), BertProcessing / RobertaProcessing
// ([CLS] A [SEP]), ByteLevel (offsets only, so nothing to do on ids) and Sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "tokenizer/json_context.h"

namespace nibble::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const Json& json, std::string_view where,
                                                   const JsonContext& context);

}  // namespace nibble::tok
