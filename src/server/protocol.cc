// Parsing and validation of OpenAI completion and chat-completion requests. Ranges follow OpenAI's
// API reference (temperature in [0, 2], top_p in (0, 1]); top_k -1 means no limit, as in vLLM.
#include "server/protocol.h"

#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include "engine/token_logprobs.h"
#include "server/api_error.h"

namespace nibble {
namespace {

using nlohmann::json;

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;  // null means "not given", as in OpenAI
  return &*it;
}

int64_t get_int(const json& value, const char* name) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {  // 16.0 is an integer written as a float; 16.5 is not
    const double d = value.get<double>();
    if (std::trunc(d) == d && std::abs(d) < 9.0e18) return static_cast<int64_t>(d);
  }
  reject(400, name, name, " must be an integer");
}

double get_number(const json& value, const char* name) {
  if (!value.is_number()) reject(400, name, name, " must be a number");
  return value.get<double>();
}

bool get_bool(const json& value, const char* name) {
  if (!value.is_boolean()) reject(400, name, name, " must be a boolean");
  return value.get<bool>();
}

std::vector<int32_t> get_token_ids(const json& value, const char* name) {
  std::vector<int32_t> ids;
  for (const json& v : value) {
    if (!v.is_number_integer())
      reject(400, name, name, " must be a string or an array of token ids");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      reject(400, name, "token id ", id, " is out of range");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

void parse_prompt(const json& body, GenerationRequest& r) {
  const json* p = field(body, "prompt");
  if (!p) reject(400, "prompt", "prompt is required");
  // A batch of exactly one prompt is that prompt; larger batches are not supported.
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    r.prompt_ids = get_token_ids(*p, "prompt");
    r.prompt_is_ids = true;
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    reject(400, "prompt", "only one prompt per request is supported");
  } else {
    reject(400, "prompt", "prompt must be a non-empty string or array of token ids");
  }
}

std::string message_content(const json& content, std::size_t index) {
  if (content.is_string()) return content.get<std::string>();
  const std::string name = cat("messages[", index, "].content");
  if (!content.is_array()) reject(400, name, name, " must be a string or an array of text parts");
  std::string text;  // [{"type": "text", "text": "..."}]: the parts joined
  for (const json& part : content) {
    const bool is_text = part.is_object() && part.value("type", "") == "text" &&
                         part.contains("text") && part["text"].is_string();
    if (!is_text) reject(400, name, "only text content parts are supported in ", name);
    text += part["text"].get<std::string>();
  }
  return text;
}

void parse_messages(const json& body, GenerationRequest& r) {
  const json* m = field(body, "messages");
  if (!m) reject(400, "messages", "messages is required");
  if (!m->is_array() || m->empty()) reject(400, "messages", "messages must be a non-empty array");
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    if (!msg.is_object()) reject(400, "messages", "messages[", i, "] must be an object");
    const json* role = field(msg, "role");
    if (!role || !role->is_string())
      reject(400, "messages", "messages[", i, "].role must be a string");
    const std::string name = role->get<std::string>();
    if (name != "system" && name != "user" && name != "assistant" && name != "developer" &&
        name != "tool")
      reject(400, "messages", "messages[", i, "].role ", json(name).dump(), " is not supported");
    const json* content = field(msg, "content");
    if (!content && name != "assistant")
      reject(400, "messages", "messages[", i, "].content is required");
    r.messages.push_back(
        {{"role", name}, {"content", content ? message_content(*content, i) : ""}});
  }
}

std::string parse_model(const json& body) {
  const json* v = field(body, "model");
  if (!v) return {};
  if (!v->is_string()) reject(400, "model", "model must be a string");
  return v->get<std::string>();
}

void parse_stop(const json& body, GenerationRequest& r) {
  const json* s = field(body, "stop");
  if (!s) return;
  if (s->is_string()) {
    r.stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    for (const json& v : *s) {
      if (!v.is_string()) reject(400, "stop", "stop must be a string or an array of strings");
      r.stop.push_back(v.get<std::string>());
    }
  } else {
    reject(400, "stop", "stop must be a string or an array of strings");
  }
  for (const std::string& text : r.stop)
    if (text.empty()) reject(400, "stop", "stop strings must not be empty");
}

// frequency_penalty and presence_penalty in OpenAI's range, repetition_penalty (vLLM and SGLang's
// extension) positive: core/logit_penalties.h.
void parse_penalties(const json& body, GenerationRequest& r) {
  Penalties& p = r.sampling.penalties;
  for (auto [name, value] : {std::pair{"frequency_penalty", &p.frequency}, std::pair{"presence_penalty", &p.presence}}) {
    const json* v = field(body, name);
    if (!v) continue;
    const double x = get_number(*v, name);
    if (!(x >= -2.0 && x <= 2.0)) reject(400, name, name, " must be in [-2, 2], got ", x);
    *value = static_cast<float>(x);
  }
  if (const json* v = field(body, "repetition_penalty")) {
    const double x = get_number(*v, "repetition_penalty");
    if (!(x > 0.0 && x <= 1e6)) reject(400, "repetition_penalty", "repetition_penalty must be in (0, 1e6], got ", x);
    p.repetition = static_cast<float>(x);
  }
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}.
void parse_logit_bias(const json& body, GenerationRequest& r) {
  const json* v = field(body, "logit_bias");
  if (!v) return;
  if (!v->is_object()) reject(400, "logit_bias", "logit_bias must be an object of token ids to biases");
  for (const auto& [key, value] : v->items()) {
    std::size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || key.empty() || id < 0 || id > std::numeric_limits<int32_t>::max())
      reject(400, "logit_bias", "logit_bias keys must be token ids, got ", json(key).dump());
    const double bias = get_number(value, "logit_bias");
    if (!(bias >= -100.0 && bias <= 100.0))
      reject(400, "logit_bias", "logit_bias values must be in [-100, 100], got ", bias);
    for (const auto& [other, unused] : r.sampling.logit_bias)
      if (other == id) reject(400, "logit_bias", "logit_bias names token ", id, " twice");
    r.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
}

void parse_stop_token_ids(const json& body, GenerationRequest& r) {
  const json* v = field(body, "stop_token_ids");
  if (!v) return;
  if (!v->is_array()) reject(400, "stop_token_ids", "stop_token_ids must be an array of token ids");
  for (const json& id : *v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      reject(400, "stop_token_ids", "stop_token_ids must be an array of non-negative integers");
    r.stop_token_ids.push_back(id.get<int64_t>());
  }
}

// How many most likely tokens' log-probabilities a response shows beside each sampled token's.
int32_t get_logprobs_count(const json& value, const char* name) {
  const int64_t k = get_int(value, name);
  if (k < 0 || k > kMaxLogprobs) reject(400, name, name, " must be in [0, ", kMaxLogprobs, "], got ", k);
  return static_cast<int32_t>(k);
}

// The fields both endpoints share.
void parse_common(const json& body, GenerationRequest& r) {
  r.model = parse_model(body);
  // Chat calls it max_completion_tokens now; max_tokens is the older name.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    const json* v = field(body, name);
    if (!v) continue;
    const int64_t n = get_int(*v, name);
    if (n < 1) reject(400, name, name, " must be at least 1, got ", n);
    r.max_tokens = n;
  }
  if (const json* v = field(body, "temperature")) {
    const double t = get_number(*v, "temperature");
    if (!(t >= 0.0 && t <= 2.0))
      reject(400, "temperature", "temperature must be in [0, 2], got ", t);
    r.sampling.temperature = static_cast<float>(t);
  }
  if (const json* v = field(body, "top_p")) {
    const double p = get_number(*v, "top_p");
    if (!(p > 0.0 && p <= 1.0)) reject(400, "top_p", "top_p must be in (0, 1], got ", p);
    r.sampling.top_p = static_cast<float>(p);
  }
  if (const json* v = field(body, "top_k")) {
    const int64_t k = get_int(*v, "top_k");
    if (k < -1) reject(400, "top_k", "top_k must be -1 (no limit) or >= 0, got ", k);
    r.sampling.top_k = k < 0 ? 0 : k;
  }
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer()) reject(400, "seed", "seed must be an integer");
    r.seed =
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = field(body, "n")) {
    r.n = get_int(*v, "n");
    if (r.n < 1 || r.n > kMaxChoices) reject(400, "n", "n must be in [1, ", kMaxChoices, "], got ", r.n);
  }
  if (const json* v = field(body, "best_of")) {
    const int64_t n = get_int(*v, "best_of");
    if (n != 1) reject(400, "best_of", "only best_of = 1 is supported, got ", n);
  }
  if (const json* v = field(body, "ignore_eos")) r.ignore_eos = get_bool(*v, "ignore_eos");
  if (const json* v = field(body, "stream")) r.stream = get_bool(*v, "stream");
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object()) reject(400, "stream_options", "stream_options must be an object");
    if (const json* u = field(*v, "include_usage"))
      r.include_usage = get_bool(*u, "stream_options.include_usage");
  }
  parse_stop(body, r);
  if (const json* v = field(body, "return_tokens_as_token_ids"))
    r.tokens_as_ids = get_bool(*v, "return_tokens_as_token_ids");
  parse_stop_token_ids(body, r);
  parse_penalties(body, r);
  parse_logit_bias(body, r);
  if (const json* v = field(body, "min_tokens")) {
    r.min_tokens = get_int(*v, "min_tokens");
    if (r.min_tokens < 0) reject(400, "min_tokens", "min_tokens must be at least 0, got ", r.min_tokens);
  }
}

json parse_body(std::string_view body) {
  json parsed;
  try {
    parsed = json::parse(body);  // also rejects strings that are not valid UTF-8
  } catch (const json::parse_error& e) {
    reject(400, "", "invalid JSON body: ", e.what());
  }
  if (!parsed.is_object()) reject(400, "", "the request body must be a JSON object");
  return parsed;
}

}  // namespace

TokenizeRequest parse_tokenize_request(std::string_view body) {
  const json parsed = parse_body(body);
  TokenizeRequest t;
  t.model = parse_model(parsed);
  if (field(parsed, "messages")) {
    GenerationRequest r;
    parse_messages(parsed, r);
    t.chat = true;
    t.messages = std::move(r.messages);
    t.add_special_tokens = false;
    if (const json* v = field(parsed, "add_generation_prompt"))
      t.add_generation_prompt = get_bool(*v, "add_generation_prompt");
  } else {
    const json* p = field(parsed, "prompt");
    if (!p || !p->is_string()) reject(400, "prompt", "prompt (a string) or messages is required");
    t.prompt = p->get<std::string>();
  }
  if (const json* v = field(parsed, "add_special_tokens")) t.add_special_tokens = get_bool(*v, "add_special_tokens");
  return t;
}

DetokenizeRequest parse_detokenize_request(std::string_view body) {
  const json parsed = parse_body(body);
  DetokenizeRequest d;
  d.model = parse_model(parsed);
  const json* v = field(parsed, "tokens");
  if (!v || !v->is_array()) reject(400, "tokens", "tokens must be an array of token ids");
  d.tokens = get_token_ids(*v, "tokens");
  return d;
}

GenerationRequest parse_completion_request(std::string_view body) {
  const json parsed = parse_body(body);
  GenerationRequest r;
  r.endpoint = Endpoint::kCompletion;
  parse_prompt(parsed, r);
  parse_common(parsed, r);
  if (const json* v = field(parsed, "logprobs")) r.logprobs = get_logprobs_count(*v, "logprobs");
  if (const json* v = field(parsed, "echo")) r.echo = get_bool(*v, "echo");
  if (const json* v = field(parsed, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
    reject(400, "suffix", "suffix is not supported");
  return r;
}

GenerationRequest parse_chat_request(std::string_view body) {
  const json parsed = parse_body(body);
  GenerationRequest r;
  r.endpoint = Endpoint::kChat;
  parse_messages(parsed, r);
  parse_common(parsed, r);
  if (const json* v = field(parsed, "echo"); v && get_bool(*v, "echo"))
    reject(400, "echo", "echo is not supported for chat completions");
  // What would change the answer's form: refused rather than answered as plain text.
  if (const json* v = field(parsed, "tools"); v && !(v->is_array() && v->empty()))
    reject(400, "tools", "tools (function calling) are not supported");
  if (const json* v = field(parsed, "tool_choice"); v && !(v->is_string() && v->get<std::string>() == "none"))
    reject(400, "tool_choice", "tool_choice is not supported (only \"none\")");
  if (const json* v = field(parsed, "response_format")) {
    if (!v->is_object() || v->value("type", "") != "text")
      reject(400, "response_format", "only response_format {\"type\": \"text\"} is supported");
  }
  const json* top = field(parsed, "top_logprobs");
  if (const json* v = field(parsed, "logprobs"); v && get_bool(*v, "logprobs"))
    r.logprobs = top ? get_logprobs_count(*top, "top_logprobs") : 0;
  else if (top)
    reject(400, "top_logprobs", "top_logprobs needs logprobs set to true");
  return r;
}

}  // namespace nibble
