// OpenAI response and stream-chunk JSON.
#include "server/responses.h"

#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace nibble {
namespace {

using json = nlohmann::ordered_json;  // fields in the order OpenAI documents them

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string random_hex(int chars) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string out;
  while (static_cast<int>(out.size()) < chars) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
    out += buf;
  }
  return out.substr(0, chars);
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json envelope(const ResponseMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}

bool is_chat(const ResponseMeta& m) {
  return m.endpoint == Endpoint::kChat;
}

// JSON has no -inf: a log-probability below -9999 shows as -9999 (as vLLM).
double shown_logprob(float logprob) {
  return logprob >= -9999.0f ? static_cast<double>(logprob) : -9999.0;
}

json utf8_bytes(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

// OpenAI's logprobs object: chat's {"content": [...]}, completions' parallel arrays; null without any.
json logprobs_json(const ResponseMeta& m, const ShownLogprobs* l) {
  if (l == nullptr) return nullptr;
  if (is_chat(m)) {
    json content = json::array();
    for (const ShownLogprob& t : *l) {
      json top = json::array();
      for (const auto& [token, logprob] : t.top)
        top.push_back({{"token", token}, {"logprob", shown_logprob(logprob)}, {"bytes", utf8_bytes(token)}});
      content.push_back({{"token", t.token},
                         {"logprob", shown_logprob(t.logprob.value_or(0.0f))},
                         {"bytes", utf8_bytes(t.token)},
                         {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
  }
  json offsets = json::array(), logprobs = json::array(), tokens = json::array(), tops = json::array();
  for (const ShownLogprob& t : *l) {
    offsets.push_back(t.text_offset);
    tokens.push_back(t.token);
    if (!t.logprob) {  // an echoed prompt's first token
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    logprobs.push_back(shown_logprob(*t.logprob));
    json top = json::object();
    for (const auto& [token, logprob] : t.top)  // two tokens of one text: the likelier one's
      if (!top.contains(token)) top[token] = shown_logprob(logprob);
    if (!top.contains(t.token)) top[t.token] = shown_logprob(*t.logprob);  // the token's own too, as vLLM
    tops.push_back(std::move(top));
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(logprobs)},
          {"tokens", std::move(tokens)},
          {"top_logprobs", std::move(tops)}};
}

// One streamed choice: a chat delta or a completion's text piece.
std::string chunk_event(const ResponseMeta& m, int index, json delta_or_text, const json& finish_reason,
                        UsageField usage, const ShownLogprobs* logprobs = nullptr) {
  json choice = {{"index", index}};
  if (is_chat(m))
    choice["delta"] = std::move(delta_or_text);
  else
    choice["text"] = std::move(delta_or_text);
  choice["logprobs"] = logprobs_json(m, logprobs);
  choice["finish_reason"] = finish_reason;
  json chunk = envelope(m, is_chat(m) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array({std::move(choice)});
  if (usage == UsageField::kNull) chunk["usage"] = nullptr;
  return "data: " + dump(chunk) + "\n\n";
}

}  // namespace

ResponseMeta new_response_meta(Endpoint endpoint, const std::string& model) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {.endpoint = endpoint,
          .id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + random_hex(24),
          .created = std::chrono::duration_cast<std::chrono::seconds>(now).count(),
          .model = model};
}

std::string full_response(const ResponseMeta& m, const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json array = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}};
    if (is_chat(m))
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    choice["logprobs"] = logprobs_json(m, c.logprobs);
    choice["finish_reason"] = c.finish_reason;
    array.push_back(std::move(choice));
  }
  json body = envelope(m, is_chat(m) ? "chat.completion" : "text_completion");
  body["choices"] = std::move(array);
  body["usage"] = usage_json(usage);
  return dump(body);
}

std::string role_event(const ResponseMeta& m, int index, UsageField usage) {
  return chunk_event(m, index, {{"role", "assistant"}, {"content", ""}}, nullptr, usage);
}

std::string text_event(const ResponseMeta& m, int index, const std::string& text, UsageField usage,
                       const ShownLogprobs* logprobs) {
  return chunk_event(m, index, is_chat(m) ? json{{"content", text}} : json(text), nullptr, usage, logprobs);
}

std::string finish_event(const ResponseMeta& m, int index, const std::string& finish_reason, UsageField usage) {
  return chunk_event(m, index, is_chat(m) ? json::object() : json(""), finish_reason, usage);
}

std::string usage_event(const ResponseMeta& m, const Usage& usage) {
  json chunk = envelope(m, is_chat(m) ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(usage);
  return "data: " + dump(chunk) + "\n\n";
}

std::string error_event(int status, const std::string& message) {
  return "data: " + error_body(status, message) + "\n\n";
}

std::string models_response(const std::string& model, int64_t created, int64_t context_length) {
  const json entry = {{"id", model},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "nibble"},
                      {"max_model_len", context_length}};
  return dump({{"object", "list"}, {"data", json::array({entry})}});
}

std::string tokenize_response(const std::vector<int32_t>& tokens, int64_t context_length) {
  return dump({{"count", tokens.size()}, {"max_model_len", context_length}, {"tokens", tokens}});
}

std::string detokenize_response(const std::string& text) {
  return dump({{"prompt", text}});
}

}  // namespace nibble
