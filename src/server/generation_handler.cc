// Whole and streamed generation responses, for the request's n choices.
#include "server/generation_handler.h"

#include <chrono>
#include <exception>
#include <iostream>
#include <memory>

#include "server/api_error.h"
#include "server/choices.h"
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
  Choices choices;
  bool started = false;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

// One call of httplib's chunked content provider: the next events of the stream. False when a
// write failed (the client is gone); the releaser then aborts the request.
bool write_stream(StreamState& s, httplib::DataSink& sink) {
  std::string out;
  if (!s.started) {
    s.started = true;
    if (s.meta.endpoint == Endpoint::kChat)
      for (int i = 0; i < s.choices.size(); ++i) out += role_event(s.meta, i, s.usage_field);
  }
  const std::vector<Choices::Update> updates = s.choices.poll(kPoll);
  const std::optional<StreamError> error = s.choices.error();
  for (const Choices::Update& u : updates) {
    const ShownLogprobs* logprobs = u.logprobs ? &*u.logprobs : nullptr;
    if (!u.text.empty() || (logprobs && !logprobs->empty()))
      out += text_event(s.meta, u.index, u.text, s.usage_field, logprobs);
    if (u.finished && !error) out += finish_event(s.meta, u.index, s.choices[u.index].finish_reason(), s.usage_field);
  }
  if (error) s.choices.abort();  // the other choices end too
  const bool done = s.choices.done();
  if (done) {
    if (error)
      out += error_event(error->status, error->message);
    else if (s.include_usage)
      out += usage_event(s.meta, s.choices.usage());
    out += kDoneEvent;
  }
  const auto now = std::chrono::steady_clock::now();
  if (out.empty() && now - s.last_write >= kKeepAlive) out = ": keep-alive\n\n";
  if (!out.empty()) {
    s.last_write = now;
    if (!sink.write(out.data(), out.size())) return false;
  }
  if (done) sink.done();
  return true;
}

void respond_streaming(ResponseMeta meta, const GenerationRequest& r, Choices choices, httplib::Response& response) {
  auto state = std::make_shared<StreamState>(
      StreamState{.meta = std::move(meta),
                  .usage_field = r.include_usage ? UsageField::kNull : UsageField::kAbsent,
                  .include_usage = r.include_usage,
                  .choices = std::move(choices)});
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
      [state](bool) { state->choices.abort(); });  // no-op when it ended normally
}

void respond_whole(const ResponseMeta& meta, Choices& choices, httplib::Response& response) {
  std::vector<ChoiceResult> results(static_cast<std::size_t>(choices.size()));
  std::vector<ShownLogprobs> shown(results.size());
  bool logprobs = false;
  while (!choices.done() && !choices.error()) {
    for (Choices::Update& u : choices.poll(1s)) {
      results[static_cast<std::size_t>(u.index)].text += u.text;
      if (!u.logprobs) continue;
      logprobs = true;
      for (ShownLogprob& t : *u.logprobs) shown[static_cast<std::size_t>(u.index)].push_back(std::move(t));
    }
  }
  if (const std::optional<StreamError> error = choices.error()) {
    choices.abort();
    response.status = error->status;
    response.set_content(error_body(error->status, error->message), "application/json");
    return;
  }
  for (std::size_t i = 0; i < results.size(); ++i) {
    results[i].finish_reason = choices[static_cast<int>(i)].finish_reason();
    if (logprobs) results[i].logprobs = &shown[i];
  }
  response.set_content(full_response(meta, results, choices.usage()), "application/json");
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
  const PreparedRequest p = prepare(r, c.tokenizer, c.chat_template, c.limits);
  // Choice i samples with the request's seed + i (each its own draws), or its own random seed.
  std::vector<std::unique_ptr<Generation>> generations;
  for (int64_t i = 0; i < r.n; ++i) {
    RequestParams params = p.params;
    if (i > 0) params.sampling.seed = r.seed ? *r.seed + static_cast<uint64_t>(i) : random_seed();
    generations.push_back(std::make_unique<Generation>(c.engine, c.metrics, c.tokenizer, p.prompt, params, r.stop));
  }
  std::optional<Echo> echo;
  if (r.echo) echo = Echo{.text = r.prompt_is_ids ? c.tokenizer.decode(p.prompt) : r.prompt_text, .prompt = p.prompt};
  Choices choices(std::move(generations), {.tokenizer = r.logprobs ? &c.tokenizer : nullptr, .as_ids = r.tokens_as_ids},
                  std::move(echo));
  ResponseMeta meta = new_response_meta(endpoint, served);
  if (r.stream)
    respond_streaming(std::move(meta), r, std::move(choices), response);
  else
    respond_whole(meta, choices, response);
}

}  // namespace nibble
