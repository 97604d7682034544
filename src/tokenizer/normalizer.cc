// Normalizer implementations (see normalizer.h). Unicode forms and lowercasing use ICU, which is
// newer than the tables in `tokenizers`; the two differ only on characters added lately.
#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

constexpr std::string_view kSupported =
    "NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Lowercase, ByteLevel, Sequence";

bool is_ascii(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

enum class UnicodeForm : uint8_t { kNfc, kNfd, kNfkc, kNfkd };

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(UnicodeForm form, std::string_view name) {
    UErrorCode status = U_ZERO_ERROR;
    switch (form) {
      case UnicodeForm::kNfc:
        icu_ = icu::Normalizer2::getNFCInstance(status);
        break;
      case UnicodeForm::kNfd:
        icu_ = icu::Normalizer2::getNFDInstance(status);
        break;
      case UnicodeForm::kNfkc:
        icu_ = icu::Normalizer2::getNFKCInstance(status);
        break;
      case UnicodeForm::kNfkd:
        icu_ = icu::Normalizer2::getNFKDInstance(status);
        break;
    }
    check(U_SUCCESS(status) && icu_ != nullptr, "ICU has no ", name,
          " normalizer: ", u_errorName(status));
  }

  std::string normalize(std::string text) const override {
    if (is_ascii(text)) return text;  // ASCII is invariant under all four forms
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    UErrorCode status = U_ZERO_ERROR;
    icu_->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                        nullptr, status);
    check(U_SUCCESS(status), "Unicode normalization failed: ", u_errorName(status));
    return out;
  }

 private:
  const icu::Normalizer2* icu_ = nullptr;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override {
    return text.empty() ? text : prefix_ + text;  // tokenizers leaves empty strings alone
  }

 private:
  std::string prefix_;
};

class Replace final : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override {
    return pattern_.replace_all(text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    std::size_t begin = 0;
    std::size_t end = text.size();
    while (left_ && begin < end) {
      std::size_t next = begin;
      if (!utf8::is_whitespace(utf8::next_char(text, next))) break;
      begin = next;
    }
    while (right_ && end > begin) {
      std::size_t start = 0;
      if (!utf8::is_whitespace(utf8::last_char(std::string_view(text).substr(0, end), &start))) {
        break;
      }
      end = start;
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

// Lowercases character by character, as `tokenizers` does (Rust's char::to_lowercase): full
// mappings such as U+0130 -> "i\u0307", but no context, so a final capital sigma becomes σ.
class Lowercase final : public Normalizer {
 public:
  std::string normalize(std::string text) const override {
    if (is_ascii(text)) {
      for (char& c : text) {
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      }
      return text;
    }
    std::string out;
    out.reserve(text.size());
    std::size_t pos = 0;
    while (pos < text.size()) {
      const char32_t c = utf8::next_char(text, pos);
      if (c < 0x80) {
        out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
        continue;
      }
      icu::UnicodeString one(static_cast<UChar32>(c));
      one.toLower(icu::Locale::getRoot());
      one.toUTF8String(out);
    }
    return out;
  }
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override {
    std::string out;
    byte_level_encode(text, out);
    return out;
  }
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& json, std::string_view where,
                                            const JsonContext& context) {
  if (json.is_null()) return nullptr;
  const std::string type = context.type_of(json, where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfc, type);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfd, type);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfkc, type);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNfkd, type);
  if (type == "Prepend") {
    return std::make_unique<Prepend>(context.string_member(json, "prepend", where));
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(make_pattern(json, where, context),
                                     context.string_member(json, "content", where));
  }
  if (type == "Strip") {
    return std::make_unique<Strip>(context.bool_member(json, "strip_left", where, true),
                                   context.bool_member(json, "strip_right", where, true));
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "Sequence") {
    const Json& list = context.member(json, "normalizers", where);
    if (!list.is_array()) context.fail_at(path_join(where, "normalizers"), "expected an array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_normalizer(list[i], path_index(path_join(where, "normalizers"), i), context);
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  context.unsupported(where, type, kSupported);
}

}  // namespace nibble::tok
