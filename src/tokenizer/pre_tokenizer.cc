// Pre-tokenizer implementations (see pre_tokenizer.h), following the `tokenizers` semantics.
#include "tokenizer/pre_tokenizer.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

constexpr std::string_view kSupported = "Sequence, Split, ByteLevel, Metaspace";

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Appends the kept spans of `piece` (is_match = remove) as new pieces, dropping empty ones.
void append_spans(const Piece& piece, const std::vector<MatchSpan>& spans,
                  std::vector<Piece>& out) {
  for (const MatchSpan& span : spans) {
    if (span.is_match || span.end == span.start) continue;
    out.push_back(Piece{piece.text.substr(span.start, span.end - span.start), -1,
                        piece.at_input_start && span.start == 0});
  }
}

// Runs `split(piece, out)` on every piece that is not an added token.
template <typename SplitFn>
void split_pieces(std::vector<Piece>& pieces, SplitFn&& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& piece : pieces) {
    if (piece.added_id >= 0) {
      out.push_back(std::move(piece));
    } else {
      split(piece, out);
    }
  }
  pieces = std::move(out);
}

class Split final : public PreTokenizer {
 public:
  Split(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](const Piece& piece, std::vector<Piece>& out) {
      std::vector<MatchSpan> spans = pattern_.find_matches(piece.text);
      if (invert_) {
        for (MatchSpan& span : spans) span.is_match = !span.is_match;
      }
      append_spans(piece, apply_split_behavior(spans, behavior_), out);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex)
      : add_prefix_space_(add_prefix_space), use_regex_(use_regex) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    static const Regex kGpt2 = Regex::from_oniguruma(kGpt2Pattern);
    split_pieces(pieces, [&](Piece& piece, std::vector<Piece>& out) {
      if (add_prefix_space_ && !piece.text.starts_with(' ')) piece.text.insert(0, 1, ' ');
      if (use_regex_) {
        std::vector<MatchSpan> spans = kGpt2.find_matches(piece.text);
        for (MatchSpan& span : spans) span.is_match = false;  // Isolated
        append_spans(piece, spans, out);
      } else if (!piece.text.empty()) {
        out.push_back(std::move(piece));
      }
    });
    for (Piece& piece : pieces) {
      if (piece.added_id >= 0) continue;
      std::string mapped;
      mapped.reserve(piece.text.size() * 2);
      byte_level_encode(piece.text, mapped);
      piece.text = std::move(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  bool use_regex_;
};

enum class PrependScheme : uint8_t { kAlways, kFirst, kNever };

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(replacement),
        replacement_pattern_(Pattern::literal(std::move(replacement))),
        scheme_(scheme),
        split_(split) {}

  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_pieces(pieces, [&](Piece& piece, std::vector<Piece>& out) {
      std::string text;
      text.reserve(piece.text.size() + replacement_.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text += c;
        }
      }
      const bool prepend = (scheme_ == PrependScheme::kAlways ||
                            (scheme_ == PrependScheme::kFirst && piece.at_input_start)) &&
                           !text.starts_with(replacement_);
      if (prepend) text.insert(0, replacement_);
      piece.text = std::move(text);
      if (!split_) {
        if (!piece.text.empty()) out.push_back(std::move(piece));
        return;
      }
      append_spans(piece,
                   apply_split_behavior(replacement_pattern_.find_matches(piece.text),
                                        SplitBehavior::kMergedWithNext),
                   out);
    });
  }

 private:
  std::string replacement_;  // one character
  Pattern replacement_pattern_;
  PrependScheme scheme_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

SplitBehavior parse_behavior(const Json& json, std::string_view where, const JsonContext& context) {
  const std::string name = context.string_member(json, "behavior", where);
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  context.fail_at(path_join(where, "behavior"),
                  cat("unknown split behavior \"", name,
                      "\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                      "Contiguous)"));
}

std::unique_ptr<PreTokenizer> make_metaspace(const Json& json, std::string_view where,
                                             const JsonContext& context) {
  const std::string replacement = context.string_member(json, "replacement", where);
  // valid_prefix_len measures the first character only.
  if (replacement.empty() || utf8::valid_prefix_len(replacement) != replacement.size()) {
    context.fail_at(path_join(where, "replacement"), "expected a single character");
  }
  PrependScheme scheme = PrependScheme::kAlways;
  if (json.contains("prepend_scheme") && !json["prepend_scheme"].is_null()) {
    const std::string name = context.string_member(json, "prepend_scheme", where);
    if (name == "always") {
      scheme = PrependScheme::kAlways;
    } else if (name == "first") {
      scheme = PrependScheme::kFirst;
    } else if (name == "never") {
      scheme = PrependScheme::kNever;
    } else {
      context.fail_at(path_join(where, "prepend_scheme"),
                      cat("unknown value \"", name, "\" (expected always, first or never)"));
    }
  }
  // Older files carry add_prefix_space instead; false means never.
  if (!context.bool_member(json, "add_prefix_space", where, true)) scheme = PrependScheme::kNever;
  return std::make_unique<Metaspace>(replacement, scheme,
                                     context.bool_member(json, "split", where, true));
}

}  // namespace

std::vector<MatchSpan> apply_split_behavior(const std::vector<MatchSpan>& spans,
                                            SplitBehavior behavior) {
  std::vector<MatchSpan> out;  // is_match here means "remove"
  out.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      return spans;
    case SplitBehavior::kIsolated:
      for (const MatchSpan& span : spans) out.push_back({span.start, span.end, false});
      return out;
    case SplitBehavior::kContiguous:
      for (const MatchSpan& span : spans) {
        if (span.is_match == previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back({span.start, span.end, false});
        }
        previous_match = span.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithPrevious:
      for (const MatchSpan& span : spans) {
        if (span.is_match && !previous_match && !out.empty()) {
          out.back().end = span.end;
        } else {
          out.push_back({span.start, span.end, false});
        }
        previous_match = span.is_match;
      }
      return out;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().start = it->start;
        } else {
          out.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
  }
  return out;
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& json, std::string_view where,
                                                 const JsonContext& context) {
  if (json.is_null()) return nullptr;
  const std::string type = context.type_of(json, where);
  if (type == "Split") {
    return std::make_unique<Split>(make_pattern(json, where, context),
                                   parse_behavior(json, where, context),
                                   context.bool_member(json, "invert", where, false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(context.bool_member(json, "add_prefix_space", where, true),
                                       context.bool_member(json, "use_regex", where, true));
  }
  if (type == "Metaspace") return make_metaspace(json, where, context);
  if (type == "Sequence") {
    const std::string list_at = path_join(where, "pretokenizers");
    const Json& list = context.member(json, "pretokenizers", where);
    if (!list.is_array()) context.fail_at(list_at, "expected an array");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_pre_tokenizer(list[i], path_index(list_at, i), context);
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  context.unsupported(where, type, kSupported);
}

}  // namespace nibble::tok
