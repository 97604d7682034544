// Scheduler: continuous batching. Each step it keeps every running sequence decoding (one token each),
// preempting the most recently admitted ones by recompute when KV blocks run out, then admits waiting
// sequences' prompts in chunks while the step's token budget and the running cap allow.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace nibble {

struct SchedulerConfig {
  int64_t max_running = 64;           // sequences decoding at once
  int64_t max_batched_tokens = 2048;  // new tokens in one step (prefill chunks included)
};

struct ScheduledSeq {
  Sequence* seq;
  int64_t new_tokens;  // tokens computed for it this step, from seq->num_computed_tokens on
  bool samples;        // the step reaches its last token, so it samples one
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager& blocks);

  void add(std::shared_ptr<Sequence> seq);
  // The next step's work; empty when nothing can run.
  std::vector<ScheduledSeq> schedule();
  // After the step: the sampled token of each sequence that sampled (in schedule order), then
  // finishing, freeing and promotion of completed prefills. Returns the sequences that finished.
  std::vector<std::shared_ptr<Sequence>> complete(const std::vector<ScheduledSeq>& step,
                                                  const std::vector<int32_t>& sampled);
  // Finishes a sequence wherever it is (reason abort), freeing its blocks. False if unknown.
  bool abort(int64_t id);

  bool idle() const { return waiting_.empty() && running_.empty(); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_preemptions() const { return preemptions_; }

 private:
  void preempt(std::shared_ptr<Sequence> seq);
  bool finished(const Sequence& seq) const;

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  std::vector<std::shared_ptr<Sequence>> running_;  // admission order
  int64_t preemptions_ = 0;
};

}  // namespace nibble
