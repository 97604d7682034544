// AsyncEngine: the Engine on a thread of its own, for many HTTP handler threads. The loop drains a
// mutex-protected inbox of new requests and aborts, runs one step, and hands each StepOutput to its
// request's RequestStream; it sleeps on a condition variable while there is nothing to do. Handlers
// only ever touch their own stream and the inbox, so no request can block the loop.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics.h"

namespace nibble {

struct StreamError {
  int status;  // HTTP status: 400 refused, 500 the engine failed, 503 shutting down
  std::string message;
};

// One request's channel from the engine loop to the handler that waits on it.
class RequestStream {
 public:
  struct Update {
    std::vector<StepOutput> outputs;   // in order; the last one may be finished
    std::optional<StreamError> error;  // the engine refused or lost the request: the stream is over
  };
  // What arrived since the last call, waiting up to `timeout` for something; may be empty.
  Update wait(std::chrono::milliseconds timeout);

 private:
  friend class AsyncEngine;
  using Clock = std::chrono::steady_clock;
  void deliver(const StepOutput& output);
  void fail(int status, std::string message);

  std::mutex mutex_;
  std::condition_variable ready_;
  Update pending_;
  // Loop thread only.
  int64_t engine_id_ = -1;
  Clock::time_point arrival_ = Clock::now();
  Clock::time_point last_token_;
  bool has_token_ = false;
};

class AsyncEngine {
 public:
  AsyncEngine(Engine& engine, Metrics& metrics);  // starts the loop
  ~AsyncEngine();                                 // shutdown()
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Queues a request; refusals (it can never fit) arrive as the stream's error.
  std::shared_ptr<RequestStream> submit(std::vector<int32_t> prompt, RequestParams params);
  // Finishes the request and frees its KV blocks; harmless once it has finished.
  void abort(const std::shared_ptr<RequestStream>& stream);
  // Aborts everything (waiting handlers get a finished output) and stops the loop.
  void shutdown();
  // False once a step has failed: the engine may be in an unknown state.
  bool healthy() const { return healthy_.load(); }

 private:
  struct NewRequest {
    std::shared_ptr<RequestStream> stream;
    std::vector<int32_t> prompt;
    RequestParams params;
  };
  void loop();
  void admit(NewRequest& request);
  void cancel(const std::shared_ptr<RequestStream>& stream);
  void deliver(const StepOutput& output);
  void fail_all(const std::string& message);
  void publish_gauges();

  Engine& engine_;
  Metrics& metrics_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<NewRequest> inbox_;
  std::vector<std::shared_ptr<RequestStream>> aborts_;
  bool stopping_ = false;
  std::unordered_map<int64_t, std::shared_ptr<RequestStream>> live_;  // loop thread only
  std::atomic<bool> healthy_{true};
  std::thread thread_;  // last: it starts once everything above exists
};

}  // namespace nibble
