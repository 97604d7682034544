// A request's choices, polled together.
#include "server/choices.h"

#include <algorithm>

namespace nibble {

std::string LogprobsView::token_text(int32_t id) const {
  if (as_ids) return "token_id:" + std::to_string(id);
  const int32_t ids[] = {id};
  return tokenizer->decode(ids, SkipSpecialTokens::kNo);
}

ShownLogprobs LogprobsView::show(const std::vector<std::pair<int32_t, TokenLogprobs>>& entries) {
  ShownLogprobs out;
  for (const auto& [id, lp] : entries) {
    ShownLogprob t{.token = token_text(id), .logprob = lp.logprob, .top = {}, .text_offset = offset};
    for (const auto& [alt, alt_lp] : lp.top) t.top.emplace_back(token_text(alt), alt_lp);
    for (unsigned char c : t.token) offset += (c & 0xC0) != 0x80;  // characters: bytes that start one
    out.push_back(std::move(t));
  }
  return out;
}

ShownLogprobs LogprobsView::show_prompt(const std::vector<int32_t>& prompt,
                                        const std::vector<std::optional<TokenLogprobs>>& logprobs) {
  ShownLogprobs out;
  for (std::size_t p = 0; p < prompt.size(); ++p) {
    const std::optional<TokenLogprobs> lp = p < logprobs.size() ? logprobs[p] : std::nullopt;
    ShownLogprob t{.token = token_text(prompt[p]), .logprob = {}, .top = {}, .text_offset = offset};
    if (lp) {
      t.logprob = lp->logprob;
      for (const auto& [alt, alt_lp] : lp->top) t.top.emplace_back(token_text(alt), alt_lp);
    }
    for (unsigned char c : t.token) offset += (c & 0xC0) != 0x80;
    out.push_back(std::move(t));
  }
  return out;
}

Choices::Choices(std::vector<std::unique_ptr<Generation>> generations, const LogprobsView& logprobs,
                 std::optional<Echo> echo)
    : generations_(std::move(generations)),
      views_(generations_.size(), logprobs),
      reported_(generations_.size()),
      echo_(std::move(echo)),
      echoed_(generations_.size()) {}

std::vector<Choices::Update> Choices::poll(std::chrono::milliseconds timeout) {
  // One choice waits the whole timeout; several wait a little each, so that none holds up the others.
  const auto wait = size() == 1 ? timeout : std::min(timeout, std::chrono::milliseconds(5));
  std::vector<Update> out;
  bool waited = false;
  for (int i = 0; i < size(); ++i) {
    if (reported_[static_cast<std::size_t>(i)]) continue;
    Generation& g = *generations_[static_cast<std::size_t>(i)];
    Update u{.index = i, .text = g.advance(waited ? std::chrono::milliseconds(0) : wait), .logprobs = {},
             .finished = g.done()};
    waited = true;
    LogprobsView& view = views_[static_cast<std::size_t>(i)];
    if (echo_ && !echoed_[static_cast<std::size_t>(i)] && (g.completion_tokens() > 0 || g.done())) {
      // The first tokens have come (and with them the prompt's log-probabilities): the echo first.
      echoed_[static_cast<std::size_t>(i)] = true;
      u.text = echo_->text + u.text;
      if (view.tokenizer != nullptr) u.logprobs = view.show_prompt(echo_->prompt, g.take_prompt_logprobs());
    }
    if (view.tokenizer != nullptr) {
      ShownLogprobs generated = view.show(g.take_logprobs());
      if (!u.logprobs) u.logprobs.emplace();
      for (ShownLogprob& t : generated) u.logprobs->push_back(std::move(t));
    }
    reported_[static_cast<std::size_t>(i)] = u.finished;
    if (!u.text.empty() || (u.logprobs && !u.logprobs->empty()) || u.finished) out.push_back(std::move(u));
  }
  return out;
}

bool Choices::done() const {
  return std::all_of(generations_.begin(), generations_.end(), [](const auto& g) { return g->done(); });
}

std::optional<StreamError> Choices::error() const {
  for (const auto& g : generations_)
    if (g->error()) return g->error();
  return std::nullopt;
}

Usage Choices::usage() const {
  Usage u{.prompt_tokens = generations_.front()->prompt_tokens(), .completion_tokens = 0};
  for (const auto& g : generations_) u.completion_tokens += g->completion_tokens();
  return u;
}

void Choices::abort() {
  for (auto& g : generations_) g->abort();
}

}  // namespace nibble
