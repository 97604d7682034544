// Engine: requests in, tokens out. step() is the whole loop: the scheduler picks a batch, the model
// runner runs it, the scheduler takes the results. Single-threaded; the server drives it from one
// thread (see server/), the `generate` command directly.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace nibble {

struct EngineConfig {
  int64_t num_blocks = 256;  // KV cache size, in blocks
  int64_t block_size = 16;   // tokens per block
  KvCacheDType kv_dtype = KvCacheDType::kBf16;
  SchedulerConfig scheduler;
  CudaGraphs cuda_graphs = CudaGraphs::kOn;  // decode steps up to max_running_requests sequences
};

struct StepOutput {
  int64_t id;
  int32_t token;
  bool finished;
  FinishReason reason;  // kNone unless finished
  int64_t prompt_tokens;
  int64_t generated_tokens;
  std::optional<TokenLogprobs> logprobs;  // where the request asked (RequestParams::logprobs)
  // With the first token, where the request asked (RequestParams::prompt_logprobs): one entry per
  // prompt token, the first empty.
  std::vector<std::optional<TokenLogprobs>> prompt_logprobs;
};

class Engine {
 public:
  Engine(Model& model, EngineConfig config);

  // Queues a request; fails (nibble::Error, nothing queued) if it cannot ever fit.
  int64_t add_request(std::vector<int32_t> prompt, RequestParams params);
  std::vector<StepOutput> step();
  bool abort(int64_t id);  // finishes the request now and frees its KV blocks
  bool has_unfinished() const { return !scheduler_.idle(); }

  const EngineConfig& config() const { return config_; }
  const Model& model() const { return model_; }
  int64_t num_running() const { return scheduler_.num_running(); }
  int64_t num_waiting() const { return scheduler_.num_waiting(); }
  int64_t num_free_blocks() const { return blocks_.num_free_blocks(); }
  int64_t num_preemptions() const { return scheduler_.num_preemptions(); }

 private:
  Model& model_;
  EngineConfig config_;
  BlockManager blocks_;
  Scheduler scheduler_;
  ModelRunner runner_;
  int64_t next_id_ = 0;
  std::unordered_map<int64_t, std::shared_ptr<Sequence>> live_;
};

}  // namespace nibble
