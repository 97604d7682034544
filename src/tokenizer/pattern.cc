// Literal and regex patterns (see pattern.h). Literals are searched directly: same matches as
// `tokenizers` (which escapes them into a regex), without the regex engine.
#include "tokenizer/pattern.h"

#include "core/error.h"

namespace nibble::tok {

Pattern Pattern::literal(std::string text) {
  Pattern p;
  // An empty literal matches the empty string everywhere in `tokenizers`; let the regex engine
  // produce exactly those matches.
  if (text.empty()) p.regex_ = Regex::from_oniguruma("");
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(std::string_view oniguruma) {
  Pattern p;
  p.regex_ = Regex::from_oniguruma(oniguruma);
  return p;
}

std::vector<MatchSpan> Pattern::find_matches(std::string_view text) const {
  if (regex_) return regex_->find_matches(text);
  std::vector<MatchSpan> spans;
  if (text.empty()) {
    spans.push_back({0, 0, false});
    return spans;
  }
  std::size_t prev = 0;
  for (std::size_t at = text.find(literal_); at != std::string_view::npos;
       at = text.find(literal_, prev)) {
    if (at != prev) spans.push_back({prev, at, false});
    spans.push_back({at, at + literal_.size(), true});
    prev = at + literal_.size();
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  for (const MatchSpan& span : find_matches(text)) {
    if (span.is_match) {
      out.append(content);
    } else {
      out.append(text.substr(span.start, span.end - span.start));
    }
  }
  return out;
}

Pattern make_pattern(const Json& json, std::string_view where, const JsonContext& context) {
  const std::string at = path_join(where, "pattern");
  const Json& pattern = context.member(json, "pattern", where);
  if (!pattern.is_object() || pattern.size() != 1) {
    context.fail_at(at, "expected {\"String\": ...} or {\"Regex\": ...}");
  }
  if (pattern.contains("String"))
    return Pattern::literal(context.string_member(pattern, "String", at));
  if (pattern.contains("Regex")) {
    const std::string source = context.string_member(pattern, "Regex", at);
    try {
      return Pattern::regex(source);
    } catch (const Error& e) {
      context.fail_at(at, e.what());
    }
  }
  context.fail_at(at, "expected {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace nibble::tok
