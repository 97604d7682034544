// The real tokenizers (Mixtral, Qwen3, DeepSeek-V3 from ../shared/data/tokenizers) against what
// the Python `tokenizers` library produced for the same strings (tests/fixtures/tokenizer/).
// Skipped with a message when the shared data is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using testing::decode_incrementally;
using testing::read_json;

const fs::path kData = "../shared/data/tokenizers";
const fs::path kFixtures = "tests/fixtures/tokenizer";

// Loading takes a fraction of a second per family; do it once for all tests.
const Tokenizer* load_family(const std::string& family) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  const fs::path file = kData / family / "tokenizer.json";
  if (!fs::exists(file)) return nullptr;
  auto& slot = loaded[family];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::load(file));
  return slot.get();
}

class FamilyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tokenizer_ = load_family(GetParam());
    if (tokenizer_ == nullptr) {
      GTEST_SKIP() << "shared tokenizer data not found: " << (kData / GetParam() / "tokenizer.json")
                   << " (tests run from the repository root; the data lives in ../shared/data)";
    }
    fixture_ = read_json(kFixtures / (GetParam() + ".json"));
  }
  const Tokenizer* tokenizer_ = nullptr;
  nlohmann::json fixture_;
};

TEST_P(FamilyTest, EncodesAndDecodesLikePython) {
  ASSERT_GE(fixture_["cases"].size(), 40u);
  testing::expect_cases_match(*tokenizer_, fixture_["cases"], GetParam());
}

TEST_P(FamilyTest, DecodesArbitraryIdsLikePython) {
  for (const auto& c : fixture_["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer_->decode(ids, SkipSpecialTokens::kYes), c["decoded"].get<std::string>())
        << c["ids"].dump();
    EXPECT_EQ(tokenizer_->decode(ids, SkipSpecialTokens::kNo),
              c["decoded_keep_special"].get<std::string>())
        << c["ids"].dump();
  }
}

TEST_P(FamilyTest, VocabSizeCountsAddedTokens) {
  EXPECT_EQ(tokenizer_->vocab_size(), fixture_["vocab_size"].get<int64_t>());
}

TEST_P(FamilyTest, IncrementalDecodingAddsUpToFullDecode) {
  for (const auto& c : fixture_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(decode_incrementally(*tokenizer_, ids), tokenizer_->decode(ids))
        << nlohmann::json(c["text"].get<std::string>().substr(0, 80)).dump();
  }
  // Arbitrary ids may hold broken byte runs, which a later id can rewrite in a full decode; only
  // the chunk boundaries are checked there (inside decode_incrementally).
  for (const auto& c : fixture_["decode_cases"]) {
    decode_incrementally(*tokenizer_, c["ids"].get<std::vector<int32_t>>());
  }
}

TEST_P(FamilyTest, LoadsFromModelDirectory) {
  const Tokenizer from_dir = Tokenizer::load(kData / GetParam());
  const std::string text = "Hello, directory! 你好";
  EXPECT_EQ(from_dir.encode(text), tokenizer_->encode(text));
}

TEST_P(FamilyTest, TokenLookups) {
  for (const auto& c : fixture_["decode_cases"]) {
    for (const auto& id_json : c["ids"]) {
      const auto id = id_json.get<int32_t>();
      const auto token = tokenizer_->id_to_token(id);
      ASSERT_TRUE(token.has_value()) << id;
      EXPECT_EQ(tokenizer_->token_to_id(*token), id) << *token;
    }
  }
  EXPECT_FALSE(tokenizer_->id_to_token(-1).has_value());
  EXPECT_FALSE(tokenizer_->id_to_token(1 << 30).has_value());
  EXPECT_FALSE(tokenizer_->token_to_id("no such token, surely").has_value());
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FamilyTest,
                         ::testing::Values("mixtral", "qwen3", "deepseek_v3"));

TEST(FamilySpecials, FlagsAndIds) {
  if (const Tokenizer* mixtral = load_family("mixtral")) {
    EXPECT_EQ(mixtral->token_to_id("<s>"), 1);
    EXPECT_EQ(mixtral->token_to_id("</s>"), 2);
    EXPECT_TRUE(mixtral->is_special(1));
    EXPECT_FALSE(mixtral->is_special(1000));
  }
  if (const Tokenizer* qwen = load_family("qwen3")) {
    const auto think = qwen->token_to_id("<think>");
    ASSERT_TRUE(think.has_value());
    EXPECT_FALSE(qwen->is_special(*think));  // an added token, but not special
    EXPECT_TRUE(qwen->is_special(*qwen->token_to_id("<|im_end|>")));
  }
  if (const Tokenizer* deepseek = load_family("deepseek_v3")) {
    EXPECT_EQ(deepseek->token_to_id("<｜begin▁of▁sentence｜>"), 0);
    EXPECT_TRUE(deepseek->is_special(0));
  }
}

// Timing: prints load and encode speed. The bounds catch a complexity blunder, not a slow machine:
// the unoptimized sanitizer build, sharing two cores with other tests, loads Qwen3's tokenizer in
// about 10 s (CI, 2026-12-06), so it gets six times the optimized build's bound.
#ifdef NDEBUG
constexpr double kSpeedBoundMs = 10'000.0;
#else
constexpr double kSpeedBoundMs = 60'000.0;
#endif

TEST(FamilySpeed, LoadAndEncode) {
  for (const std::string family : {"qwen3", "mixtral", "deepseek_v3"}) {
    const fs::path file = kData / family / "tokenizer.json";
    if (!fs::exists(file)) GTEST_SKIP() << "shared tokenizer data not found: " << file;
    const auto t0 = std::chrono::steady_clock::now();
    const Tokenizer tokenizer = Tokenizer::load(file);
    const auto t1 = std::chrono::steady_clock::now();
    const auto fixture = read_json(kFixtures / (family + ".json"));
    const std::string seed = fixture["cases"].back()["text"];
    std::string text;
    while (text.size() < 100'000) text += seed;
    text.resize(100'000);
    while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80)
      text.pop_back();
    if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
    const auto t2 = std::chrono::steady_clock::now();
    const auto ids = tokenizer.encode(text);
    const auto t3 = std::chrono::steady_clock::now();
    const auto again = tokenizer.encode(text);  // warm word cache
    const auto t4 = std::chrono::steady_clock::now();
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    std::printf("%s: load %.0f ms, encode 100 KB %.1f ms cold / %.1f ms warm (%zu ids)\n",
                family.c_str(), ms(t1 - t0), ms(t3 - t2), ms(t4 - t3), ids.size());
    EXPECT_EQ(ids, again);
    EXPECT_LT(ms(t1 - t0), kSpeedBoundMs);
    EXPECT_LT(ms(t3 - t2), kSpeedBoundMs);
  }
}

}  // namespace
}  // namespace nibble
