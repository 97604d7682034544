// Prometheus text exposition (version 0.0.4) of the server's metrics, all named nibble_*.
#include "server/metrics.h"

#include <cstdio>

namespace nibble {
namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);  // 0.005, not 0.0050000000000000001
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double value) {
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard lock(mutex_);
  std::size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", "le=\"" + number(bounds_[i]) + "\"",
           static_cast<double>(cumulative));
  }
  sample(out, name + "_bucket", "le=\"+Inf\"", static_cast<double>(count_));
  sample(out, name + "_sum", "", sum_);
  sample(out, name + "_count", "", static_cast<double>(count_));
}

Metrics::Metrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                           2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      inter_token_latency({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                           0.075,  0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5}),
      step_requests({1, 2, 4, 8, 16, 32, 64, 128, 256, 512}) {}

void Metrics::count_response(int status) {
  std::lock_guard lock(mutex_);
  ++responses_[status];
}

void Metrics::count_finished(const std::string& finish_reason) {
  std::lock_guard lock(mutex_);
  ++finished_[finish_reason];
}

std::string Metrics::render() const {
  std::string out;
  {
    std::lock_guard lock(mutex_);
    header(out, "nibble_http_requests_total", "counter", "HTTP responses sent, by status code");
    for (const auto& [status, n] : responses_)
      sample(out, "nibble_http_requests_total", "status=\"" + std::to_string(status) + "\"",
             static_cast<double>(n));
    header(out, "nibble_requests_finished_total", "counter",
           "generation requests that ended, by finish reason");
    for (const auto& [reason, n] : finished_)
      sample(out, "nibble_requests_finished_total", "finish_reason=\"" + reason + "\"",
             static_cast<double>(n));
  }
  header(out, "nibble_prompt_tokens_total", "counter",
         "prompt tokens prefilled for admitted requests");
  sample(out, "nibble_prompt_tokens_total", "", static_cast<double>(prompt_tokens.load()));
  header(out, "nibble_generation_tokens_total", "counter", "tokens generated");
  sample(out, "nibble_generation_tokens_total", "", static_cast<double>(generation_tokens.load()));
  header(out, "nibble_num_requests_running", "gauge", "requests in the running batch");
  sample(out, "nibble_num_requests_running", "", static_cast<double>(engine.num_running.load()));
  header(out, "nibble_num_requests_waiting", "gauge", "requests waiting to be admitted");
  sample(out, "nibble_num_requests_waiting", "", static_cast<double>(engine.num_waiting.load()));
  header(out, "nibble_kv_blocks_used", "gauge", "KV cache blocks in use");
  sample(out, "nibble_kv_blocks_used", "", static_cast<double>(engine.kv_blocks_used.load()));
  header(out, "nibble_kv_blocks_total", "gauge", "KV cache blocks in all");
  sample(out, "nibble_kv_blocks_total", "", static_cast<double>(engine.kv_blocks_total.load()));
  time_to_first_token.render(out, "nibble_time_to_first_token_seconds",
                             "time from arrival to the first token");
  inter_token_latency.render(out, "nibble_inter_token_latency_seconds",
                             "time between consecutive tokens");
  step_requests.render(out, "nibble_step_requests", "requests given a token by each engine step");
  return out;
}

}  // namespace nibble
