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

// Everything one stream needs after the handler has returned (httplib calls the provider later).
struct StreamState {
  ResponseMeta meta;
  UsageField usage_field;
  bool include_usage;
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
  if (!text.empty()) out += text_event(s.meta, text, s.usage_field);
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

void respond_streaming(ResponseMeta meta, const GenerationRequest& r,
                       std::unique_ptr<Generation> generation, httplib::Response& response) {
  auto state = std::make_shared<StreamState>(
      StreamState{.meta = std::move(meta),
                  .usage_field = r.include_usage ? UsageField::kNull : UsageField::kAbsent,
                  .include_usage = r.include_usage,
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

void respond_whole(const ResponseMeta& meta, Generation& g, httplib::Response& response) {
  std::string text;
  while (!g.done()) text += g.advance(1s);
  if (g.error()) {
    response.status = g.error()->status;
    response.set_content(error_body(g.error()->status, g.error()->message), "application/json");
    return;
  }
  response.set_content(
      full_response(meta, text, g.finish_reason(), {g.prompt_tokens(), g.completion_tokens()}),
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
  if (r.stream)
    respond_streaming(std::move(meta), r, std::move(generation), response);
  else
    respond_whole(meta, *generation, response);
}

}  // namespace nibble
