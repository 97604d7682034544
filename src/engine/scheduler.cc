// Continuous batching with chunked prefill and preemption by recompute.
#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace nibble {

Scheduler::Scheduler(SchedulerConfig config, BlockManager& blocks) : config_(config), blocks_(blocks) {
  check(config.max_running >= 1 && config.max_batched_tokens >= 1, "scheduler limits must be positive");
}

void Scheduler::add(std::shared_ptr<Sequence> seq) {
  const int64_t capacity = blocks_.num_blocks() * blocks_.block_size();
  check(seq->num_tokens() + seq->params().max_tokens <= capacity, "the request needs ",
        seq->num_tokens() + seq->params().max_tokens, " tokens of KV cache; the cache holds ", capacity);
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(std::move(seq));
}

void Scheduler::preempt(std::shared_ptr<Sequence> seq) {
  // Recompute: drop its KV; its prompt plus generated tokens are prefilled again when readmitted.
  blocks_.release(*seq);
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_front(std::move(seq));
  ++preemptions_;
}

namespace {

// A request for prompt log-probabilities takes a logit row for each prompt token it computes, and
// every sampling sequence one: the rows of a step stay within max_running, as many as the memory
// plan's activation reserve counts, so a prompt chunk is cut to the rows left (to one token at the
// least, which may go one row past).
int64_t cap_for_prompt_rows(const Sequence& seq, int64_t n, int64_t& rows_left) {
  if (seq.params().prompt_logprobs < 0 || seq.prompt_logprobs_sent) return n;
  const int64_t prompt_left = std::max<int64_t>(0, seq.num_prompt_tokens() - 1 - seq.num_computed_tokens);
  if (std::min(n, prompt_left) > rows_left) n = std::max<int64_t>(1, rows_left);
  rows_left = std::max<int64_t>(0, rows_left - std::min(n, prompt_left));
  return n;
}

}  // namespace

std::vector<ScheduledSeq> Scheduler::schedule() {
  std::vector<ScheduledSeq> step;
  int64_t budget = config_.max_batched_tokens;
  int64_t prompt_rows_left = config_.max_running;
  // 1. Running sequences: those still prefilling continue their prompt; the rest decode one token.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence& seq = *running_[i];
    const int64_t remaining = seq.num_tokens() - seq.num_computed_tokens;
    const int64_t n = cap_for_prompt_rows(seq, std::min(remaining, budget), prompt_rows_left);
    while (!blocks_.can_append(seq, n) && running_.size() > i + 1) preempt(running_.back()), running_.pop_back();
    if (!blocks_.can_append(seq, n)) {  // alone and still no room: it waits for others to finish
      preempt(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    blocks_.append_slots(seq, n);
    step.push_back({&seq, n, n == remaining});
    if (n == remaining) prompt_rows_left = std::max<int64_t>(0, prompt_rows_left - 1);  // its sampling row
    budget -= n;
    ++i;
  }
  // 2. Waiting sequences, oldest first, in prompt chunks.
  while (!waiting_.empty() && budget > 0 && static_cast<int64_t>(running_.size()) < config_.max_running) {
    Sequence& seq = *waiting_.front();
    blocks_.attach_prefix(seq);
    const int64_t remaining = seq.num_tokens() - seq.num_computed_tokens;
    const int64_t n = cap_for_prompt_rows(seq, std::min(remaining, budget), prompt_rows_left);
    if (!blocks_.can_append(seq, n)) {  // it waits until running sequences free blocks
      blocks_.release(seq);
      break;
    }
    blocks_.append_slots(seq, n);
    seq.status = SequenceStatus::kRunning;
    running_.push_back(waiting_.front());
    waiting_.pop_front();
    step.push_back({&seq, n, n == remaining});
    if (n == remaining) prompt_rows_left = std::max<int64_t>(0, prompt_rows_left - 1);
    budget -= n;
  }
  return step;
}

bool Scheduler::finished(const Sequence& seq) const {
  const auto& p = seq.params();
  if (seq.num_generated() >= p.max_tokens) return true;
  return std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), seq.last_token()) != p.stop_token_ids.end();
}

std::vector<std::shared_ptr<Sequence>> Scheduler::complete(const std::vector<ScheduledSeq>& step,
                                                           const std::vector<int32_t>& sampled) {
  std::size_t next = 0;
  for (const ScheduledSeq& s : step) {
    s.seq->num_computed_tokens += s.new_tokens;
    blocks_.register_full_blocks(*s.seq);
    if (!s.samples) continue;
    check(next < sampled.size(), "scheduler: fewer sampled tokens than sampling sequences");
    s.seq->append(sampled[next++]);
    if (finished(*s.seq)) {
      const auto& stops = s.seq->params().stop_token_ids;
      s.seq->finish_reason = std::find(stops.begin(), stops.end(), s.seq->last_token()) != stops.end()
                                 ? FinishReason::kStop
                                 : FinishReason::kLength;
      s.seq->status = SequenceStatus::kFinished;
    }
  }
  std::vector<std::shared_ptr<Sequence>> done;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->status == SequenceStatus::kFinished) {
      blocks_.release(**it);
      done.push_back(*it);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

bool Scheduler::abort(int64_t id) {
  auto match = [id](const std::shared_ptr<Sequence>& s) { return s->id() == id; };
  auto finish = [this](Sequence& seq) {
    blocks_.release(seq);
    seq.status = SequenceStatus::kFinished;
    seq.finish_reason = FinishReason::kAbort;
  };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    finish(**it);
    running_.erase(it);
    return true;
  }
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), match); it != waiting_.end()) {
    finish(**it);
    waiting_.erase(it);
    return true;
  }
  return false;
}

}  // namespace nibble
