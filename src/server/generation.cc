// One request's life on the handler side.
#include "server/generation.h"

namespace nibble {

Generation::Generation(AsyncEngine& engine, Metrics& metrics, const Tokenizer& tokenizer,
                       std::vector<int32_t> prompt, RequestParams params,
                       std::vector<std::string> stop)
    : engine_(engine),
      metrics_(metrics),
      prompt_tokens_(static_cast<int64_t>(prompt.size())),
      text_(tokenizer, std::move(stop), params.min_tokens),  // before params moves on
      stream_(engine.submit(std::move(prompt), std::move(params))) {}

Generation::~Generation() {
  abort();
}

void Generation::abort() {
  if (done_) return;
  engine_.abort(stream_);
  finish("abort");
}

void Generation::finish(const std::string& reason) {
  done_ = true;
  finish_reason_ = reason;
  metrics_.count_finished(error_ ? "error" : reason);
}

std::string Generation::advance(std::chrono::milliseconds timeout) {
  if (done_) return {};
  RequestStream::Update update = stream_->wait(timeout);
  std::string text;
  for (const StepOutput& out : update.outputs) {
    if (!out.prompt_logprobs.empty()) prompt_logprobs_ = out.prompt_logprobs;
    if (out.token >= 0 && out.logprobs) logprobs_.emplace_back(out.token, *out.logprobs);
    // A stop token (end-of-sequence, or one of stop_token_ids) counts, but its text is not shown (as
    // vLLM); an end-of-sequence token is special and would show nothing anyway.
    if (out.token >= 0 && out.finished && out.reason == FinishReason::kStop)
      text_.count_hidden();
    else if (out.token >= 0)
      text += text_.push(out.token);
    if (text_.stopped()) {  // the engine does not know stop strings: end it here
      engine_.abort(stream_);
      finish("stop");
      return text;
    }
    if (out.finished) {
      text += text_.finish();
      finish(text_.stopped() ? "stop" : finish_reason_name(out.reason));
      return text;
    }
  }
  if (update.error) {
    error_ = update.error;
    finish("error");
  }
  return text;
}

}  // namespace nibble
