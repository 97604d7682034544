// Shared helpers for the tokenizer tests: reading fixtures written by
// tools/make_tokenizer_fixtures.py, temporary tokenizer.json files, and checks that compare
// nibble's output with what the Python `tokenizers` library recorded.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace nibble::testing {

nlohmann::json read_json(const std::filesystem::path& file);

// A fresh file under the system temp directory holding `contents`, removed by the destructor.
class TempFile {
 public:
  explicit TempFile(const std::string& contents, const std::string& name = "tokenizer.json");
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::filesystem::path path_;
};

// Checks every case of a fixture ("text", "ids", "ids_no_special", "decoded",
// "decoded_keep_special") against `tokenizer`; `label` names the fixture in failures.
void expect_cases_match(const Tokenizer& tokenizer, const nlohmann::json& cases,
                        const std::string& label);

// Feeds `ids` to an IncrementalDecoder one at a time and returns the concatenated chunks, checking
// that no chunk ends inside a character or (before flush) on U+FFFD.
std::string decode_incrementally(const Tokenizer& tokenizer, const std::vector<int32_t>& ids);

// First index where the two sequences differ, for readable failure messages.
std::string describe_mismatch(const std::vector<int32_t>& expected,
                              const std::vector<int32_t>& actual);

}  // namespace nibble::testing
