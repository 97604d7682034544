// Chat templates: turns a conversation (OpenAI-style messages) into the prompt text a model was
// trained on, by rendering the model's Jinja chat template exactly as Hugging Face transformers'
// apply_chat_template does (jinja2 with trim_blocks, lstrip_blocks, loop controls,
// raise_exception and its tojson). Models without a template get ChatML. Not a tokenizer: the
// caller encodes the result (without adding BOS again when the template writes it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>

namespace nibble {

enum class GenerationPrompt : uint8_t { kOmit, kAdd };  // end with the assistant turn's header

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // an assistant's thinking, when kept apart
  nlohmann::ordered_json tool_calls;             // null, or [{type, function: {name, arguments}}]
};

// Messages as a template sees them: objects with role, content and, where set,
// reasoning_content and tool_calls.
nlohmann::ordered_json to_json(std::span<const ChatMessage> messages);

class ChatTemplate {
 public:
  // From a model directory: chat_template.jinja when present, else tokenizer_config.json's
  // "chat_template" (a string, or a list of {name, template} whose "default" is used); ChatML
  // when neither has one. bos_token/eos_token come from tokenizer_config.json (a string or
  // {"content": ...}). Throws nibble::Error for unreadable files and template syntax errors.
  static ChatTemplate from_tokenizer_config(const std::filesystem::path& model_dir);
  static ChatTemplate from_string(std::string source, std::string bos_token = "",
                                  std::string eos_token = "");
  static ChatTemplate chatml();  // the fallback

  // Renders with the variables transformers passes: messages, tools and documents (None unless in
  // `extra`), add_generation_prompt, the special tokens (bos_token, eos_token...), then every key
  // of `extra` (tools, enable_thinking, ...). Key order matters (tojson keeps it), hence
  // ordered_json; a nlohmann::json converts implicitly but with sorted keys. Throws nibble::Error
  // naming the template line for runtime errors, including the template's raise_exception().
  std::string render(const nlohmann::ordered_json& messages, GenerationPrompt generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  bool is_fallback() const;
  const std::string& source() const;

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

 private:
  struct Impl;
  enum class Origin : uint8_t { kModel, kFallback };
  explicit ChatTemplate(std::shared_ptr<const Impl> impl);
  static ChatTemplate parse(std::string source, std::string origin, Origin kind,
                            nlohmann::ordered_json special_tokens);
  std::shared_ptr<const Impl> impl_;  // immutable: copies share it, renders may run concurrently
};

}  // namespace nibble
