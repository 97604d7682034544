// Whole and streamed generation responses.
#include "server/generation_handler.h"

#include <chrono>
#include <exception>
#include <iostream>
#include <memory>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/responses.h"

namespace nibble {
namespace {

using namespace std::chrono_literals;

// How long a stream may stay silent before a keep-alive comment goes out: the write that tells a
// client is gone while its request is still queued.
constexpr auto kKeepAlive = 2s;
constexpr auto kPoll = 200ms;  // how often a streaming handler wakes up while waiting

// How a request's tokens show in its logprobs: their text with special tokens (or "token_id:N"), and
// the character where each starts among those texts, counted on from `offset`.
struct LogprobsView {
  const Tokenizer* tokenizer = nullptr;  // null: the request asked for none
  bool as_ids = false;
  int64_t offset = 0;

  std::string token_text(int32_t id) const {
    if (as_ids) return "token_id:" + std::to_string(id);
    const int32_t ids[] = {id};
    return tokenizer->decode(ids, SkipSpecialTokens::kNo);
  }
  ShownLogprobs show(const std::vector<std::pair<int32_t, TokenLogprobs>>& entries) {
    ShownLogprobs out;
    for (const auto& [id, lp] : entries) {
      ShownLogprob t{.token = token_text(id), .logprob = lp.logprob, .top = {}, .text_offset = offset};
      for (const auto& [alt, alt_lp] : lp.top) t.top.emplace_back(token_text(alt), alt_lp);
      for (unsigned char c : t.token) offset += (c & 0xC0) != 0x80;  // characters: bytes that start one
      out.push_back(std::move(t));
    }
    return out;
  }
};

// Everything one stream needs after the handler has returned (httplib calls the provider later).
struct StreamState {
  ResponseMeta meta;
  UsageField usage_field;
  bool include_usage;
  LogprobsView logprobs;
  std::unique_ptr<Generation> generation;
  bool started = false;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// One call of httplib's chunked content provider: the next events of the stream. False when a
// write failed (the client is gone); the releaser then aborts the request.
bool write_stream(StreamState& s, httplib::DataSink& sink) {
  std::string out;
  if (!s.started) {
    s.started = true;
    if (s.meta.endpoint == Endpoint::kChat) out += role_event(s.meta, s.usage_field);
  }
  Generation& g = *s.generation;
  const std::string text = g.advance(kPoll);
  const auto logprobs = g.take_logprobs();
  if (s.logprobs.tokenizer != nullptr && (!text.empty() || !logprobs.empty())) {
    const ShownLogprobs shown = s.logprobs.show(logprobs);
    out += text_event(s.meta, text, s.usage_field, &shown);
  } else if (!text.empty()) {
    out += text_event(s.meta, text, s.usage_field);
  }
  if (g.done()) {
    if (g.error()) {
      out += error_event(g.error()->status, g.error()->message);
    } else {
      out += finish_event(s.meta, g.finish_reason(), s.usage_field);
      if (s.include_usage) out += usage_event(s.meta, {g.prompt_tokens(), g.completion_tokens()});
    }
    out += kDoneEvent;
  }
  const auto now = std::chrono::steady_clock::now();
  if (out.empty() && now - s.last_write >= kKeepAlive) out = ": keep-alive\n\n";
  if (!out.empty()) {
    s.last_write = now;
    if (!sink.write(out.data(), out.size())) return false;
  }
  if (g.done()) sink.done();
  return true;
}

void respond_streaming(ResponseMeta meta, const GenerationRequest& r, LogprobsView logprobs,
                       std::unique_ptr<Generation> generation, httplib::Response& response) {
  auto state = std::make_shared<StreamState>(
      StreamState{.meta = std::move(meta),
                  .usage_field = r.include_usage ? UsageField::kNull : UsageField::kAbsent,
                  .include_usage = r.include_usage,
                  .logprobs = logprobs,
                  .generation = std::move(generation)});
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [state](std::size_t, httplib::DataSink& sink) {
        try {
          return write_stream(*state, sink);
        } catch (
            const std::exception& e) {  // after the headers: end the stream with an error event
          std::cerr << "nibble: stream failed: " << e.what() << "\n";
          const std::string event = error_event(500, e.what()) + kDoneEvent;
          sink.write(event.data(), event.size());
          sink.done();
          return false;
        }
      },
      [state](bool) { state->generation->abort(); });  // no-op when it ended normally
}

void respond_whole(const ResponseMeta& meta, LogprobsView logprobs, Generation& g, httplib::Response& response) {
  std::string text;
  ShownLogprobs shown;
  while (!g.done()) {
    text += g.advance(1s);
    if (logprobs.tokenizer != nullptr)
      for (ShownLogprob& t : logprobs.show(g.take_logprobs())) shown.push_back(std::move(t));
  }
  if (g.error()) {
    response.status = g.error()->status;
    response.set_content(error_body(g.error()->status, g.error()->message), "application/json");
    return;
  }
  response.set_content(
      full_response(meta, text, g.finish_reason(), {g.prompt_tokens(), g.completion_tokens()},
                    logprobs.tokenizer != nullptr ? &shown : nullptr),
      "application/json");
}

}  // namespace

void handle_generation(const ServingContext& c, Endpoint endpoint, const httplib::Request& request,
                       httplib::Response& response) {
  const GenerationRequest r = endpoint == Endpoint::kChat ? parse_chat_request(request.body)
                                                          : parse_completion_request(request.body);
  const std::string& served = c.options.served_model_name;
  if (!r.model.empty() && r.model != served)
    reject(404, "model", "the model ", r.model, " does not exist; this server serves ", served);
  if (!c.engine.healthy()) reject(503, "", "the engine has failed; restart the server");
  PreparedRequest p = prepare(r, c.tokenizer, c.chat_template, c.limits);
  auto generation = std::make_unique<Generation>(c.engine, c.metrics, c.tokenizer,
                                                 std::move(p.prompt), std::move(p.params), r.stop);
  ResponseMeta meta = new_response_meta(endpoint, served);
  const LogprobsView logprobs{.tokenizer = r.logprobs ? &c.tokenizer : nullptr, .as_ids = r.tokens_as_ids};
  if (r.stream)
    respond_streaming(std::move(meta), r, logprobs, std::move(generation), response);
  else
    respond_whole(meta, logprobs, *generation, response);
}

}  // namespace nibble
