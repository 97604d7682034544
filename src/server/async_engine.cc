// The engine loop thread and the request streams it feeds.
#include "server/async_engine.h"

#include <exception>
#include <iostream>

#include "core/error.h"

namespace nibble {

RequestStream::Update RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout,
                  [&] { return !pending_.outputs.empty() || pending_.error.has_value(); });
  Update out = std::move(pending_);
  pending_ = {};
  return out;
}

void RequestStream::deliver(const StepOutput& output) {
  {
    std::lock_guard lock(mutex_);
    pending_.outputs.push_back(output);
  }
  ready_.notify_all();
}

void RequestStream::fail(int status, std::string message) {
  {
    std::lock_guard lock(mutex_);
    pending_.error = StreamError{status, std::move(message)};
  }
  ready_.notify_all();
}

AsyncEngine::AsyncEngine(Engine& engine, Metrics& metrics)
    : engine_(engine), metrics_(metrics), thread_([this] { loop(); }) {}

AsyncEngine::~AsyncEngine() {
  shutdown();
}

std::shared_ptr<RequestStream> AsyncEngine::submit(std::vector<int32_t> prompt,
                                                   RequestParams params) {
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      stream->fail(503, "the server is shutting down");
      return stream;
    }
    inbox_.push_back({stream, std::move(prompt), std::move(params)});
  }
  wake_.notify_one();
  return stream;
}

void AsyncEngine::abort(const std::shared_ptr<RequestStream>& stream) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    aborts_.push_back(stream);
  }
  wake_.notify_one();
}

void AsyncEngine::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void AsyncEngine::admit(NewRequest& request) {
  try {
    request.stream->engine_id_ =
        engine_.add_request(std::move(request.prompt), std::move(request.params));
    live_[request.stream->engine_id_] = request.stream;
  } catch (const std::exception& e) {
    request.stream->fail(400, e.what());
  }
}

void AsyncEngine::cancel(const std::shared_ptr<RequestStream>& stream) {
  const auto it = live_.find(stream->engine_id_);
  if (it == live_.end() || it->second != stream) return;  // finished already (or never admitted)
  engine_.abort(stream->engine_id_);
  live_.erase(it);
  stream->deliver(
      {.id = stream->engine_id_, .token = -1, .finished = true, .reason = FinishReason::kAbort});
}

void AsyncEngine::deliver(const StepOutput& output) {
  const auto it = live_.find(output.id);
  if (it == live_.end()) return;
  RequestStream& stream = *it->second;
  const auto now = RequestStream::Clock::now();
  if (!stream.has_token_) {
    metrics_.time_to_first_token.observe(
        std::chrono::duration<double>(now - stream.arrival_).count());
    metrics_.prompt_tokens += static_cast<uint64_t>(output.prompt_tokens);
    stream.has_token_ = true;
  } else {
    metrics_.inter_token_latency.observe(
        std::chrono::duration<double>(now - stream.last_token_).count());
  }
  stream.last_token_ = now;
  ++metrics_.generation_tokens;
  stream.deliver(output);
  if (output.finished) live_.erase(it);
}

void AsyncEngine::fail_all(const std::string& message) {
  for (auto& [id, stream] : live_) {
    engine_.abort(id);
    stream->fail(500, message);
  }
  live_.clear();
}

void AsyncEngine::publish_gauges() {
  EngineGauges& g = metrics_.engine;
  g.num_running = engine_.num_running();
  g.num_waiting = engine_.num_waiting();
  g.kv_blocks_total = engine_.config().num_blocks;
  g.kv_blocks_used = engine_.config().num_blocks - engine_.num_free_blocks();
}

void AsyncEngine::loop() {
  publish_gauges();
  while (true) {
    std::vector<NewRequest> added;
    std::vector<std::shared_ptr<RequestStream>> aborted;
    bool stopping = false;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !inbox_.empty() || !aborts_.empty() || engine_.has_unfinished();
      });
      added.swap(inbox_);
      aborted.swap(aborts_);
      stopping = stopping_;
    }
    for (NewRequest& r : added) admit(r);
    for (const auto& stream : aborted) cancel(stream);
    if (stopping) {
      std::vector<std::shared_ptr<RequestStream>> everyone;
      for (const auto& [id, stream] : live_) everyone.push_back(stream);
      for (const auto& stream : everyone) cancel(stream);
      publish_gauges();
      return;
    }
    if (engine_.has_unfinished()) {
      try {
        const std::vector<StepOutput> outputs = engine_.step();
        if (!outputs.empty()) metrics_.step_requests.observe(static_cast<double>(outputs.size()));
        for (const StepOutput& output : outputs) deliver(output);
      } catch (const std::exception& e) {
        std::cerr << "nibble: engine step failed: " << e.what() << "\n";
        healthy_ = false;
        fail_all(cat("the engine failed: ", e.what()));
      }
    }
    publish_gauges();
  }
}

}  // namespace nibble
