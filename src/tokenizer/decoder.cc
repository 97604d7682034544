// Decoder implementations (see decoder.h), following the `tokenizers` semantics, including its
// lossy UTF-8 handling: ByteLevel decodes all bytes at once (one U+FFFD per invalid subpart) and
// ByteFallback writes one U+FFFD per byte of an invalid run.
#include "tokenizer/decoder.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pattern.h"
#include "tokenizer/utf8.h"

namespace nibble::tok {
namespace {

constexpr std::string_view kSupported =
    "ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence";

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xNN>" -> byte. The two characters are parsed as Rust's u8::from_str_radix(.., 16) does,
// which also takes a '+' sign before a single digit.
std::optional<unsigned char> parse_byte_token(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  const int hi = hex_digit(token[3]);
  const int lo = hex_digit(token[4]);
  if (token[3] == '+' && lo >= 0) return static_cast<unsigned char>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      // A token with any character outside the byte-level alphabet (an added token such as
      // "<｜User｜>") contributes its own UTF-8 bytes.
      if (auto decoded = byte_level_decode(token)) {
        bytes += *decoded;
      } else {
        bytes += token;
      }
    }
    tokens.assign(1, utf8::to_valid_lossy(bytes));
  }
};

class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;  // bytes of consecutive <0xNN> tokens
    const auto flush = [&] {
      if (pending.empty()) return;
      if (!utf8::first_invalid(pending)) {
        out.push_back(pending);
      } else {
        for (std::size_t i = 0; i < pending.size(); ++i) out.emplace_back(utf8::kReplacement);
      }
      pending.clear();
    };
    for (std::string& token : tokens) {
      if (const auto byte = parse_byte_token(token)) {
        pending += static_cast<char>(*byte);
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const std::string& token : tokens) joined += token;
    tokens.assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from every token.
class Strip final : public Decoder {
 public:
  Strip(std::string content, std::size_t start, std::size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) {
      std::size_t begin = 0;
      for (std::size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0 &&
                              begin < token.size();
           ++i) {
        begin += content_.size();
      }
      std::size_t end = token.size();
      for (std::size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                              token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;  // one character
  std::size_t start_;
  std::size_t stop_;
};

class Replace final : public Decoder {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& token : tokens) token = pattern_.replace_all(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Replacement characters become spaces, except in the first token (which held the prepended one)
// unless the prepend scheme is "never".
class Metaspace final : public Decoder {
 public:
  Metaspace(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      std::string_view token = tokens[i];
      for (std::size_t at = token.find(replacement_); at != std::string_view::npos;
           at = token.find(replacement_)) {
        out.append(token.substr(0, at));
        if (i != 0 || !strip_first_) out += ' ';
        token.remove_prefix(at + replacement_.size());
      }
      out.append(token);
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

std::string single_char_member(const Json& json, const char* key, std::string_view where,
                               const JsonContext& context) {
  std::string value = context.string_member(json, key, where);
  // valid_prefix_len measures the first character only.
  if (value.empty() || utf8::valid_prefix_len(value) != value.size()) {
    context.fail_at(path_join(where, key), "expected a single character");
  }
  return value;
}

std::size_t count_member(const Json& json, const char* key, std::string_view where,
                         const JsonContext& context) {
  const int64_t value = context.int_member(json, key, where, 0);
  if (value < 0) context.fail_at(path_join(where, key), "expected a non-negative integer");
  return static_cast<std::size_t>(value);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& json, std::string_view where,
                                      const JsonContext& context) {
  if (json.is_null()) return nullptr;
  const std::string type = context.type_of(json, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    return std::make_unique<Strip>(single_char_member(json, "content", where, context),
                                   count_member(json, "start", where, context),
                                   count_member(json, "stop", where, context));
  }
  if (type == "Replace") {
    return std::make_unique<Replace>(make_pattern(json, where, context),
                                     context.string_member(json, "content", where));
  }
  if (type == "Metaspace") {
    bool strip_first = context.bool_member(json, "add_prefix_space", where, true);
    if (json.contains("prepend_scheme") && !json["prepend_scheme"].is_null()) {
      strip_first = context.string_member(json, "prepend_scheme", where) != "never";
    }
    return std::make_unique<Metaspace>(single_char_member(json, "replacement", where, context),
                                       strip_first);
  }
  if (type == "Sequence") {
    const std::string list_at = path_join(where, "decoders");
    const Json& list = context.member(json, "decoders", where);
    if (!list.is_array()) context.fail_at(list_at, "expected an array");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_decoder(list[i], path_index(list_at, i), context);
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  context.unsupported(where, type, kSupported);
}

}  // namespace nibble::tok
