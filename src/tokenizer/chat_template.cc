// ChatTemplate: finds a model's chat template and special tokens, parses the template once, and
// renders conversations with the variables Hugging Face transformers passes to it.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/jinja_parser.h"
#include "tokenizer/jinja_render.h"
#include "tokenizer/utf8.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using jinja::Json;

// The ChatML layout (Qwen, and transformers' old default): <|im_start|>role\ncontent<|im_end|>\n.
constexpr std::string_view kChatMl =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

constexpr std::string_view kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                               "sep_token", "cls_token", "mask_token"};

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), file.string(), ": cannot open");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  check(!in.bad(), file.string(), ": cannot read");
  return std::move(buffer).str();
}

void check_utf8(const Json& j, const std::string& what) {
  if (j.is_string()) {
    check(!utf8::first_invalid(j.get_ref<const std::string&>()), what,
          ": invalid UTF-8 in a string");
  } else if (j.is_structured()) {
    for (const auto& [key, item] : j.items()) {
      check(!utf8::first_invalid(key), what, ": invalid UTF-8 in a key");
      check_utf8(item, what);
    }
  }
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::optional<std::string> token_text(const Json& config, std::string_view key,
                                      const fs::path& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  const auto content = it->is_object() ? it->find("content") : it->end();
  check(it->is_object() && content != it->end() && content->is_string(), file.string(), ": ", key,
        " must be a string or an object with a string \"content\"");
  return content->get<std::string>();
}

}  // namespace

struct ChatTemplate::Impl {
  std::string source;
  std::string origin;  // names the template in errors
  bool fallback = false;
  Json special_tokens = Json::object();  // only the tokens that are set, as transformers does
  jinja::Body body;
};

ChatTemplate::ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::parse(std::string source, std::string origin, Origin kind,
                                 nlohmann::ordered_json special_tokens) {
  auto impl = std::make_shared<Impl>();
  impl->origin = std::move(origin);
  impl->fallback = kind == Origin::kFallback;
  impl->special_tokens = std::move(special_tokens);
  check(!utf8::first_invalid(source), impl->origin, ": invalid UTF-8");
  try {
    impl->body = jinja::parse(source);
  } catch (const Error& e) {
    fail(impl->origin, ": ", e.what());
  }
  impl->source = std::move(source);
  return ChatTemplate(std::move(impl));
}

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos_token,
                                       std::string eos_token) {
  Json tokens = Json::object();
  if (!bos_token.empty()) tokens["bos_token"] = std::move(bos_token);
  if (!eos_token.empty()) tokens["eos_token"] = std::move(eos_token);
  return parse(std::move(source), "chat template", Origin::kModel, std::move(tokens));
}

ChatTemplate ChatTemplate::chatml() {
  return parse(std::string(kChatMl), "ChatML fallback template", Origin::kFallback, Json::object());
}

ChatTemplate ChatTemplate::from_tokenizer_config(const fs::path& model_dir) {
  const fs::path config_file = model_dir / "tokenizer_config.json";
  const fs::path jinja_file = model_dir / "chat_template.jinja";
  Json config = Json::object();
  if (fs::exists(config_file)) {
    try {
      config = Json::parse(read_text(config_file));
    } catch (const Json::exception& e) {
      fail(config_file.string(), ": invalid JSON: ", e.what());
    }
    check(config.is_object(), config_file.string(), ": expected a JSON object");
  }
  Json tokens = Json::object();
  for (const auto key : kSpecialTokens) {
    if (auto text = token_text(config, key, config_file)) tokens[std::string(key)] = *text;
  }
  if (fs::exists(jinja_file)) {
    return parse(read_text(jinja_file), jinja_file.string(), Origin::kModel, std::move(tokens));
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return parse(std::string(kChatMl), "ChatML fallback template", Origin::kFallback,
                 std::move(tokens));
  }
  const std::string origin = config_file.string() + " chat_template";
  if (it->is_string())
    return parse(it->get<std::string>(), origin, Origin::kModel, std::move(tokens));
  check(it->is_array(), origin, ": expected a string or a list of {name, template}");
  for (const auto& entry : *it) {
    check(entry.is_object() && entry.contains("name") && entry.contains("template") &&
              entry["name"].is_string() && entry["template"].is_string(),
          origin, ": each entry must have a string name and template");
    if (entry["name"] == "default") {
      return parse(entry["template"].get<std::string>(), origin + " \"default\"", Origin::kModel,
                   std::move(tokens));
    }
  }
  fail(origin, ": several templates but none named \"default\"");
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                 GenerationPrompt generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  check(messages.is_array(), impl_->origin, ": messages must be a JSON array");
  check(extra.is_object() || extra.is_null(), impl_->origin,
        ": extra variables must be a JSON object");
  check_utf8(messages, impl_->origin + ": messages");
  check_utf8(extra, impl_->origin + ": extra variables");
  // Values borrow from `messages`, `extra` and the special tokens, which outlive the render.
  auto scope = std::make_shared<jinja::Scope>();
  static const Json kNone;
  scope->set("messages", jinja::Value::view(nullptr, messages));
  scope->set("tools", jinja::Value::view(nullptr, kNone));
  scope->set("documents", jinja::Value::view(nullptr, kNone));
  scope->set("add_generation_prompt",
             jinja::Value(Json(generation_prompt == GenerationPrompt::kAdd)));
  for (const auto& [key, value] : impl_->special_tokens.items()) {
    scope->set(key, jinja::Value::view(nullptr, value));
  }
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items())
      scope->set(key, jinja::Value::view(nullptr, value));
  }
  try {
    return jinja::Renderer().render(impl_->body, std::move(scope));
  } catch (const Error& e) {
    fail(impl_->origin, ": ", e.what());
  } catch (const std::exception& e) {  // a bug here, not in the template: still one clear line
    fail(impl_->origin, ": internal error while rendering: ", e.what());
  }
}

bool ChatTemplate::is_fallback() const {
  return impl_->fallback;
}
const std::string& ChatTemplate::source() const {
  return impl_->source;
}

nlohmann::ordered_json to_json(std::span<const ChatMessage> messages) {
  Json out = Json::array();
  for (const auto& message : messages) {
    Json m = {{"role", message.role}, {"content", message.content}};
    if (message.reasoning_content) m["reasoning_content"] = *message.reasoning_content;
    if (!message.tool_calls.is_null()) m["tool_calls"] = message.tool_calls;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace nibble
