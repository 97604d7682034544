// The engine loop.
#include "engine/engine.h"

#include "core/error.h"

namespace nibble {

Engine::Engine(Model& model, EngineConfig config)
    : model_(model),
      config_(config),
      blocks_(config.num_blocks, config.block_size),
      scheduler_(config.scheduler, blocks_),
      runner_(model, config.num_blocks, config.block_size, config.kv_dtype,
              {.cuda_graphs = config.cuda_graphs,
               .max_graph_batch = config.scheduler.max_running,
               .max_context = 0}) {}

int64_t Engine::add_request(std::vector<int32_t> prompt, RequestParams params) {
  const ModelConfig& c = model_.config();
  for (int32_t id : prompt) check(id >= 0 && id < c.vocab_size, "token id ", id, " is outside the vocabulary");
  const auto total = static_cast<int64_t>(prompt.size()) + params.max_tokens;
  check(total <= c.max_position_embeddings, "prompt (", prompt.size(), " tokens) plus max_tokens (",
        params.max_tokens, ") exceeds the model's context of ", c.max_position_embeddings, " tokens");
  if (!params.ignore_eos)
    params.stop_token_ids.insert(params.stop_token_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
  validate(params.sampling);
  for (const int32_t k : {params.logprobs, params.prompt_logprobs})
    check(k >= -1 && k <= kMaxLogprobs, "logprobs must be in [0, ", kMaxLogprobs, "] (or -1: none), got ", k);
  auto seq = std::make_shared<Sequence>(next_id_, std::move(prompt), std::move(params));
  scheduler_.add(seq);
  live_[next_id_] = seq;
  return next_id_++;
}

std::vector<StepOutput> Engine::step() {
  const std::vector<ScheduledSeq> work = scheduler_.schedule();
  if (work.empty()) return {};
  const std::vector<int32_t> sampled = runner_.run(work);
  scheduler_.complete(work, sampled);
  std::vector<StepOutput> out;
  for (const ScheduledSeq& s : work) {
    if (!s.samples) continue;
    Sequence& seq = *s.seq;
    const bool done = seq.status == SequenceStatus::kFinished;
    out.push_back({.id = seq.id(), .token = seq.last_token(), .finished = done, .reason = seq.finish_reason,
                   .prompt_tokens = seq.num_prompt_tokens(), .generated_tokens = seq.num_generated(),
                   .logprobs = std::move(seq.last_logprobs), .prompt_logprobs = {}});
    seq.last_logprobs.reset();
    if (seq.params().prompt_logprobs >= 0 && !seq.prompt_logprobs_sent) {
      seq.prompt_logprobs.resize(static_cast<std::size_t>(seq.num_prompt_tokens()));  // a one-token prompt has none
      out.back().prompt_logprobs = std::move(seq.prompt_logprobs);
      seq.prompt_logprobs_sent = true;
    }
    if (done) live_.erase(seq.id());
  }
  return out;
}

bool Engine::abort(int64_t id) {
  if (!scheduler_.abort(id)) return false;
  live_.erase(id);
  return true;
}

}  // namespace nibble
