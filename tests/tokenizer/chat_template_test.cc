// Chat templates against Python jinja2 set up as transformers' apply_chat_template does: every
// conversation in tests/fixtures/chat_template (written by tools/make_chat_template_fixtures.py)
// must render byte for byte. The Qwen3/DeepSeek-V3 fixtures carry their templates, so they run
// without the shared data; loading those templates from ../shared/data is checked when present.
#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "tokenizer_test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using testing::TempFile;

const fs::path kFixtures = "tests/fixtures/chat_template";
const fs::path kData = "../shared/data/tokenizers";

Json read_fixture(const std::string& name) {
  std::ifstream in(kFixtures / (name + ".json"), std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << (kFixtures / (name + ".json"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return Json::parse(buffer.str());
}

std::string token(const Json& special_tokens, const char* key) {
  return special_tokens.contains(key) ? special_tokens[key].get<std::string>() : "";
}

GenerationPrompt prompt(const Json& c) {
  return c["add_generation_prompt"].get<bool>() ? GenerationPrompt::kAdd : GenerationPrompt::kOmit;
}

// The first differing byte, with some context, for readable failures.
std::string mismatch(const std::string& expected, const std::string& actual) {
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return cat("first difference at byte ", i,
             "\n  expected: ", Json(expected.substr(from, 100)).dump(),
             "\n  actual:   ", Json(actual.substr(from, 100)).dump());
}

void expect_fixture(const ChatTemplate& chat, const Json& fixture, size_t min_cases) {
  ASSERT_GE(fixture["cases"].size(), min_cases);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    std::string actual;
    ASSERT_NO_THROW(actual = chat.render(c["messages"], prompt(c), c["extra"]));
    const std::string expected = c["expected"];
    EXPECT_EQ(actual, expected) << mismatch(expected, actual);
  }
}

class ModelTemplates : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelTemplates, MatchJinja2) {
  const Json fixture = read_fixture(GetParam());
  const ChatTemplate chat =
      ChatTemplate::from_string(fixture["template"], token(fixture["special_tokens"], "bos_token"),
                                token(fixture["special_tokens"], "eos_token"));
  EXPECT_FALSE(chat.is_fallback());
  expect_fixture(chat, fixture, 30);
}

TEST_P(ModelTemplates, LoadFromTokenizerConfig) {
  const fs::path dir = kData / GetParam();
  if (!fs::exists(dir / "tokenizer_config.json")) {
    GTEST_SKIP() << "shared tokenizer data not found: " << (dir / "tokenizer_config.json")
                 << " (tests run from the repository root; the data lives in ../shared/data)";
  }
  const Json fixture = read_fixture(GetParam());
  const ChatTemplate chat = ChatTemplate::from_tokenizer_config(dir);
  EXPECT_FALSE(chat.is_fallback());
  EXPECT_EQ(chat.source(), fixture["template"].get<std::string>());
  expect_fixture(chat, fixture, 30);
}

INSTANTIATE_TEST_SUITE_P(ChatTemplate, ModelTemplates, ::testing::Values("qwen3", "deepseek_v3"));

TEST(ChatTemplate, ChatMlFallbackMatchesJinja2) {
  const Json fixture = read_fixture("chatml");
  const ChatTemplate chat = ChatTemplate::chatml();
  EXPECT_TRUE(chat.is_fallback());
  EXPECT_EQ(chat.source(), fixture["template"].get<std::string>());
  expect_fixture(chat, fixture, 10);
}

// Small templates covering whitespace control, expressions, loops, scoping, filters and tests;
// where jinja2 raises, nibble must throw nibble::Error (at parse or at render).
TEST(ChatTemplate, SyntheticTemplatesMatchJinja2) {
  const Json fixture = read_fixture("synthetic");
  ASSERT_GE(fixture["cases"].size(), 100u);
  for (const auto& c : fixture["cases"]) {
    const std::string source = c["template"];
    SCOPED_TRACE(c["name"].get<std::string>() + ": " + source);
    const auto render = [&] {
      const ChatTemplate chat = ChatTemplate::from_string(
          source, token(c["special_tokens"], "bos_token"), token(c["special_tokens"], "eos_token"));
      return chat.render(c["messages"], prompt(c), c["extra"]);
    };
    if (c.contains("error")) {
      EXPECT_THROW(render(), Error) << "jinja2: " << c["error"].get<std::string>();
      continue;
    }
    std::string actual;
    try {
      actual = render();
    } catch (const Error& e) {
      ADD_FAILURE() << "threw: " << e.what();
      continue;
    }
    EXPECT_EQ(actual, c["expected"].get<std::string>()) << mismatch(c["expected"], actual);
  }
}

std::string error_of(const std::string& source, const Json& messages = Json::array()) {
  try {
    ChatTemplate::from_string(source).render(messages, GenerationPrompt::kAdd);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ChatTemplate, ErrorsNameThePosition) {
  EXPECT_EQ(error_of("ab\n  {{ x | frobnicate }}"),
            "chat template: line 2, column 10: unknown filter 'frobnicate'");
  EXPECT_EQ(error_of("{{ x is frobnicated }}"),
            "chat template: line 1, column 9: unknown test 'frobnicated'");
  EXPECT_EQ(error_of("{% if true %}\nx"),
            "chat template: line 2, column 2: unexpected end of template, expected 'elif' or "
            "'else' or 'endif'");
  EXPECT_EQ(error_of("{{ 1 + }}"),
            "chat template: line 1, column 8: unexpected end of print statement");
  EXPECT_EQ(error_of("{% frob %}"),
            "chat template: line 1, column 4: unknown or unsupported tag 'frob'");
  EXPECT_EQ(error_of("{{ 'a' $ }}"), "chat template: line 1, column 8: unexpected character '$'");
  EXPECT_EQ(error_of("x\n{{ missing.field }}"),
            "chat template: line 2, column 4: 'missing' is undefined");
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"),
            "chat template: line 1, column 4: unknown or unsupported tag 'include'");
}

TEST(ChatTemplate, RaiseExceptionCarriesTheTemplateMessage) {
  const std::string source =
      "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
      "{{ raise_exception('Unsupported role: ' + m.role) }}{% endif %}{% endfor %}";
  const ChatTemplate chat = ChatTemplate::from_string(source);
  EXPECT_EQ(
      chat.render(Json::parse(R"([{"role": "user", "content": "hi"}])"), GenerationPrompt::kAdd),
      "");
  try {
    chat.render(Json::parse(R"([{"role": "robot", "content": "hi"}])"), GenerationPrompt::kAdd);
    ADD_FAILURE() << "expected nibble::Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "chat template: line 1, column 71: Unsupported role: robot");
  }
}

TEST(ChatTemplate, RejectsBadInputs) {
  const ChatTemplate chat = ChatTemplate::chatml();
  EXPECT_THROW(chat.render(Json::object(), GenerationPrompt::kAdd), Error);
  EXPECT_THROW(
      chat.render(Json::array({{{"role", "user"}, {"content", "\xff"}}}), GenerationPrompt::kAdd),
      Error);
  EXPECT_THROW(ChatTemplate::from_string("\xc3"), Error);
  // ChatML concatenates content: a list of parts is a Python TypeError there, an error here.
  EXPECT_THROW(chat.render(Json::parse(R"([{"role": "user", "content": [{"type": "text"}]}])"),
                           GenerationPrompt::kAdd),
               Error);
}

TEST(ChatTemplate, TokenizerConfigVariants) {
  {  // no chat_template: ChatML, special tokens still read
    const TempFile config(
        R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>"})",
        "tokenizer_config.json");
    const ChatTemplate chat = ChatTemplate::from_tokenizer_config(config.dir());
    EXPECT_TRUE(chat.is_fallback());
    EXPECT_EQ(
        chat.render(Json::parse(R"([{"role": "user", "content": "Hi"}])"), GenerationPrompt::kAdd),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  }
  {  // a list of named templates: "default" is used; object-valued special tokens
    const TempFile config(R"({"chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}],
                              "bos_token": {"content": "<s>"}, "eos_token": null})",
                          "tokenizer_config.json");
    const ChatTemplate chat = ChatTemplate::from_tokenizer_config(config.dir());
    EXPECT_FALSE(chat.is_fallback());
    EXPECT_EQ(chat.render(Json::array(), GenerationPrompt::kOmit), "<s>D");
  }
  {  // chat_template.jinja wins over tokenizer_config.json
    const TempFile config(R"({"chat_template": "config"})", "tokenizer_config.json");
    std::ofstream(config.dir() / "chat_template.jinja") << "jinja file\n";
    EXPECT_EQ(ChatTemplate::from_tokenizer_config(config.dir())
                  .render(Json::array(), GenerationPrompt::kAdd),
              "jinja file");
  }
  {  // a directory with no files at all
    const TempFile empty("", "unrelated.txt");
    EXPECT_TRUE(ChatTemplate::from_tokenizer_config(empty.dir()).is_fallback());
  }
  const TempFile no_default(R"({"chat_template": [{"name": "tool_use", "template": "T"}]})",
                            "tokenizer_config.json");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(no_default.dir()), Error);
  const TempFile bad_json(R"({"chat_template": )", "tokenizer_config.json");
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(bad_json.dir()), Error);
  const TempFile bad_syntax(R"({"chat_template": "{% if %}"})", "tokenizer_config.json");
  try {
    ChatTemplate::from_tokenizer_config(bad_syntax.dir());
    ADD_FAILURE() << "expected nibble::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json chat_template: line 1"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplate, ChatMessagesToJson) {
  const ChatMessage messages[] = {
      {"user", "What is 2+2?", std::nullopt, nullptr},
      {"assistant", "", "Add them.",
       Json::parse(R"([{"type": "function", "function": {"name": "add"}}])")},
  };
  EXPECT_EQ(
      to_json(messages).dump(),
      R"([{"role":"user","content":"What is 2+2?"},{"role":"assistant","content":"","reasoning_content":"Add them.",)"
      R"("tool_calls":[{"type":"function","function":{"name":"add"}}]}])");
}

TEST(ChatTemplate, RendersConcurrently) {
  const Json fixture = read_fixture("synthetic");
  const std::string source =
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content | upper }}{% endfor %}{{ ns.n }}";
  const ChatTemplate chat = ChatTemplate::from_string(source);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Json messages = Json::array({{{"role", "user"}, {"content", "t" + std::to_string(t)}}});
      for (int round = 0; round < 200; ++round) {
        if (chat.render(messages, GenerationPrompt::kAdd) != "T" + std::to_string(t) + "1")
          ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace nibble
