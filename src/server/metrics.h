// Metrics: the server's Prometheus counters, gauges and histograms, rendered as text for GET
// /metrics. Safe to update from any thread; the engine loop publishes the gauges after every step.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace nibble {

// A cumulative histogram over fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct EngineGauges {
  std::atomic<int64_t> num_running{0};
  std::atomic<int64_t> num_waiting{0};
  std::atomic<int64_t> kv_blocks_used{0};
  std::atomic<int64_t> kv_blocks_total{0};
};

class Metrics {
 public:
  Metrics();

  void count_response(int status);                        // every HTTP response, by status code
  void count_finished(const std::string& finish_reason);  // every generation request that ended
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generation_tokens{0};
  EngineGauges engine;
  Histogram time_to_first_token;
  Histogram inter_token_latency;
  Histogram step_requests;  // requests given a token by each engine step: the batch that ran

  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> responses_;
  std::map<std::string, uint64_t> finished_;
};

}  // namespace nibble
