// Helpers for the tokenizer tests (see tokenizer_test_util.h).
#include "tokenizer_test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "tokenizer/utf8.h"

namespace nibble::testing {

namespace fs = std::filesystem;

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << file;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

TempFile::TempFile(const std::string& contents, const std::string& name) {
  static std::atomic<int> counter{0};
  dir_ = fs::temp_directory_path() /
         ("nibble_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir_);
  path_ = dir_ / name;
  std::ofstream out(path_, std::ios::binary);
  out << contents;
}

TempFile::~TempFile() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

std::string describe_mismatch(const std::vector<int32_t>& expected,
                              const std::vector<int32_t>& actual) {
  std::size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  std::ostringstream out;
  out << "lengths " << expected.size() << " vs " << actual.size() << ", first difference at " << i
      << ":";
  for (std::size_t j = i; j < i + 6 && j < expected.size(); ++j) out << " " << expected[j];
  out << " (expected) vs";
  for (std::size_t j = i; j < i + 6 && j < actual.size(); ++j) out << " " << actual[j];
  return out.str();
}

void expect_cases_match(const Tokenizer& tokenizer, const nlohmann::json& cases,
                        const std::string& label) {
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::string shown = nlohmann::json(text.substr(0, 80)).dump();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto ids_no_special = c["ids_no_special"].get<std::vector<int32_t>>();
    const auto got = tokenizer.encode(text, AddSpecialTokens::kYes);
    EXPECT_EQ(got, ids) << label << " " << shown << ": " << describe_mismatch(ids, got);
    const auto got_plain = tokenizer.encode(text, AddSpecialTokens::kNo);
    EXPECT_EQ(got_plain, ids_no_special) << label << " (no special) " << shown << ": "
                                         << describe_mismatch(ids_no_special, got_plain);
    EXPECT_EQ(tokenizer.decode(ids, SkipSpecialTokens::kYes), c["decoded"].get<std::string>())
        << label << " decode " << shown;
    EXPECT_EQ(tokenizer.decode(ids, SkipSpecialTokens::kNo),
              c["decoded_keep_special"].get<std::string>())
        << label << " decode keeping special tokens " << shown;
  }
}

std::string decode_incrementally(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  IncrementalDecoder decoder(tokenizer);
  std::string text;
  for (const int32_t id : ids) {
    const std::string chunk = decoder.push(id);
    EXPECT_FALSE(utf8::first_invalid(chunk).has_value()) << "chunk is not valid UTF-8";
    EXPECT_FALSE(chunk.ends_with(utf8::kReplacement))
        << "chunk released before its last character was complete";
    text += chunk;
  }
  const std::string rest = decoder.flush();
  EXPECT_FALSE(utf8::first_invalid(rest).has_value()) << "flushed text is not valid UTF-8";
  return text + rest;
}

}  // namespace nibble::testing
