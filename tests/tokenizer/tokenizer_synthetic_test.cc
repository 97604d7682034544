// Tiny tokenizers trained by tools/make_tokenizer_fixtures.py, in variants that exercise what the
// real files do not (Split behaviours and invert, added-token lstrip/rstrip/single_word/normalized,
// Metaspace prepend schemes, unknown tokens, normalizer chains, post-processors, decoders),
// compared with the Python `tokenizers` library. Needs no shared data.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace nibble {
namespace {

using testing::read_json;
using testing::TempFile;

const nlohmann::json& synthetic() {
  static const nlohmann::json kFixture = read_json("tests/fixtures/tokenizer/synthetic.json");
  return kFixture;
}

// Same composition as the fixture script: overrides replace top-level keys, "model" is merged.
nlohmann::json compose(const nlohmann::json& base, const nlohmann::json& overrides) {
  nlohmann::json result = base;
  for (const auto& [key, value] : overrides.items()) {
    if (key == "model") {
      result["model"].update(value);
    } else {
      result[key] = value;
    }
  }
  return result;
}

TEST(SyntheticTokenizers, MatchPython) {
  const auto& fixture = synthetic();
  ASSERT_GE(fixture["variants"].size(), 20u);
  for (const auto& variant : fixture["variants"]) {
    const std::string name = variant["name"];
    SCOPED_TRACE(name);
    const auto json =
        compose(fixture["bases"][variant["base"].get<std::string>()], variant["overrides"]);
    const TempFile file(json.dump());
    const Tokenizer tokenizer = Tokenizer::load(file.path());
    EXPECT_EQ(tokenizer.vocab_size(), variant["vocab_size"].get<int64_t>());
    testing::expect_cases_match(tokenizer, variant["cases"], name);
    for (const auto& c : variant["cases"]) {
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(testing::decode_incrementally(tokenizer, ids), tokenizer.decode(ids))
          << name << " " << c["text"].dump();
    }
  }
}

TEST(SyntheticTokenizers, EncodeIsThreadSafe) {
  const auto& fixture = synthetic();
  const auto& variant = fixture["variants"][0];
  const TempFile file(
      compose(fixture["bases"][variant["base"].get<std::string>()], variant["overrides"]).dump());
  const Tokenizer tokenizer = Tokenizer::load(file.path());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (const auto& c : variant["cases"]) {
          if (tokenizer.encode(c["text"].get<std::string>()) !=
              c["ids"].get<std::vector<int32_t>>()) {
            ++failures;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace nibble
