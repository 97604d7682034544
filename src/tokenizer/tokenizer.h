// Hugging Face tokenizer.json BPE tokenizers: Metaspace + byte-fallback (Mistral/Mixtral) and
// byte-level with regex Split pre-tokenizers and NFC normalization (Qwen3, DeepSeek-V3), with added
// and special tokens and the post-processor (BOS). Encoding matches `tokenizers` id for id.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

enum class AddSpecialTokens : uint8_t { kNo, kYes };   // apply the post-processor (e.g. BOS)
enum class SkipSpecialTokens : uint8_t { kNo, kYes };  // drop special tokens when decoding

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json file, or a model directory containing one.
  static Tokenizer load(const std::filesystem::path& path);

  std::vector<int32_t> encode(std::string_view text,
                              AddSpecialTokens add_special = AddSpecialTokens::kYes) const;
  std::string decode(std::span<const int32_t> ids,
                     SkipSpecialTokens skip_special = SkipSpecialTokens::kYes) const;

  int64_t vocab_size() const;  // including added tokens
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of ids into text as it arrives, never emitting part of a UTF-8 character: the text
// returned by push() is exactly what decode(all ids so far) adds beyond what was returned before,
// once that suffix ends on a whole character.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer,
                              SkipSpecialTokens skip_special = SkipSpecialTokens::kYes);
  std::string push(int32_t id);  // new text, possibly empty
  std::string flush();           // whatever is left at the end (may hold U+FFFD for broken bytes)

 private:
  enum class Stream : uint8_t { kOpen, kEnded };  // kEnded: release even a trailing U+FFFD
  std::string advance(Stream stream);

  const Tokenizer& tokenizer_;
  SkipSpecialTokens skip_special_;
  std::vector<int32_t> ids_;
  std::size_t prefix_offset_ = 0;  // ids before this are settled
  std::size_t read_offset_ = 0;
};

}  // namespace nibble
