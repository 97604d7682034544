// Load-time and input errors: each is one nibble::Error line naming the file and the component.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace nibble {
namespace {

using testing::TempFile;

// The message of the Error that loading `path` throws ("" if it loads).
std::string load_error(const std::filesystem::path& path) {
  try {
    Tokenizer::load(path);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    return message;
  }
  return "";
}

std::string load_error_for(const std::string& contents) {
  const TempFile file(contents);
  std::string message = load_error(file.path());
  // Report with a stable file name.
  const std::string path = file.path().string();
  if (message.starts_with(path)) message = "tokenizer.json" + message.substr(path.size());
  return message;
}

// A minimal valid BPE tokenizer.json with one component replaced.
std::string minimal_with(const std::string& key, const std::string& value) {
  nlohmann::json json = nlohmann::json::parse(R"({
    "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
    "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})");
  json[key] = nlohmann::json::parse(value);
  return json.dump();
}

TEST(TokenizerErrors, MissingFile) {
  const std::string message = load_error("no/such/dir/tokenizer.json");
  EXPECT_NE(message.find("no/such/dir/tokenizer.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not found"), std::string::npos) << message;
}

TEST(TokenizerErrors, DirectoryWithoutTokenizerJson) {
  const TempFile file("{}", "config.json");
  const std::string message = load_error(file.dir());
  EXPECT_NE(message.find("no tokenizer.json"), std::string::npos) << message;
}

TEST(TokenizerErrors, InvalidJson) {
  const std::string message = load_error_for("{\"model\": [1, 2,");
  EXPECT_TRUE(message.starts_with("tokenizer.json: invalid JSON")) << message;
}

TEST(TokenizerErrors, UnsupportedModels) {
  EXPECT_EQ(load_error_for(minimal_with("model", R"({"type": "WordPiece", "vocab": {}})")),
            "tokenizer.json: model type \"WordPiece\" is not supported (supported: BPE)");
  EXPECT_EQ(load_error_for(minimal_with("model", R"({"type": "Unigram", "vocab": []})")),
            "tokenizer.json: model type \"Unigram\" is not supported (supported: BPE)");
}

TEST(TokenizerErrors, UnsupportedComponentsNameTheirPlace) {
  EXPECT_TRUE(
      load_error_for(minimal_with("normalizer", R"({"type": "BertNormalizer"})"))
          .starts_with("tokenizer.json: normalizer type \"BertNormalizer\" is not supported"));
  EXPECT_TRUE(
      load_error_for(
          minimal_with("pre_tokenizer",
                       R"({"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]})"))
          .starts_with("tokenizer.json: pre_tokenizer.pretokenizers[0] type \"Whitespace\" is not "
                       "supported"));
  EXPECT_TRUE(load_error_for(minimal_with("decoder", R"({"type": "WordPiece"})"))
                  .starts_with("tokenizer.json: decoder type \"WordPiece\" is not supported"));
  EXPECT_TRUE(load_error_for(minimal_with("post_processor", R"({"type": "Fancy"})"))
                  .starts_with("tokenizer.json: post_processor type \"Fancy\" is not supported"));
}

TEST(TokenizerErrors, BadFields) {
  const std::string regex = load_error_for(minimal_with(
      "pre_tokenizer",
      R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false})"));
  EXPECT_TRUE(regex.starts_with("tokenizer.json: pre_tokenizer.pattern: cannot compile regex"))
      << regex;
  const std::string behavior = load_error_for(minimal_with(
      "pre_tokenizer",
      R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": false})"));
  EXPECT_TRUE(
      behavior.starts_with("tokenizer.json: pre_tokenizer.behavior: unknown split behavior"))
      << behavior;
  const std::string merge = load_error_for(
      minimal_with("model", R"({"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "z"]]})"));
  EXPECT_TRUE(
      merge.starts_with("tokenizer.json: model.merges[0]: merge of tokens not in the vocab"))
      << merge;
  EXPECT_EQ(load_error_for(minimal_with("model", R"({"vocab": {"a": 0}})")),
            "tokenizer.json: model.type: missing field");
  EXPECT_EQ(
      load_error_for(minimal_with("model", R"({"type": "BPE", "vocab": {"a": -1}, "merges": []})")),
      "tokenizer.json: model.vocab.a: expected a non-negative 32-bit id");
  EXPECT_EQ(load_error_for(
                minimal_with("model", R"({"type": "BPE", "vocab": {"a": 0}, "merges": ["a"]})")),
            "tokenizer.json: model.merges[0]: expected \"a b\" or [\"a\", \"b\"]");
  EXPECT_EQ(load_error_for(minimal_with("model", R"({"type": "BPE", "vocab": [], "merges": []})")),
            "tokenizer.json: model.vocab: expected an object of token -> id");
  EXPECT_EQ(load_error_for(minimal_with("model", R"({"type": "BPE", "vocab": {}})")),
            "tokenizer.json: model.merges: missing field");
  EXPECT_EQ(load_error_for(R"({"version": "1.0"})"), "tokenizer.json: model: missing field");
}

TEST(TokenizerErrors, InvalidUtf8Input) {
  const TempFile file(minimal_with("decoder", "null"));
  const Tokenizer tokenizer = Tokenizer::load(file.path());
  EXPECT_EQ(tokenizer.encode("ab"), std::vector<int32_t>{2});
  EXPECT_THROW(tokenizer.encode("a\xC3"), Error);
  EXPECT_THROW(tokenizer.encode("\xFF"), Error);
}

}  // namespace
}  // namespace nibble
