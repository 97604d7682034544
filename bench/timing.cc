// Event timing and graph replay for the benchmark.
#include "timing.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace nibble::bench {
namespace {

class GraphExec {
 public:
  ~GraphExec() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  }
  cudaGraphExec_t* out() { return &exec_; }
  cudaGraphExec_t get() const { return exec_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// Captures `launch` on `stream`; returns the error text when the capture or instantiation fails.
std::string capture(const LayerLaunch& launch, cudaStream_t stream, GraphExec& exec) {
  cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string error;
  try {
    launch(stream);
  } catch (const Error& e) {
    error = e.what();
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (error.empty() && ended != cudaSuccess) error = cat("capture: ", cudaGetErrorString(ended));
  if (error.empty()) {
    const cudaError_t made = cudaGraphInstantiate(exec.out(), graph, 0);
    if (made != cudaSuccess) error = cat("instantiate: ", cudaGetErrorString(made));
  }
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  if (!error.empty())
    (void)cudaGetLastError();  // clear the (non-sticky) error a failed capture leaves
  return error;
}

int reps_for(double one_run_us, const TimingOptions& options) {
  const double wanted = options.target_seconds * 1e6 / std::max(one_run_us, 1.0);
  return static_cast<int>(std::clamp(wanted, static_cast<double>(options.min_reps),
                                     static_cast<double>(options.max_reps)));
}

}  // namespace

std::vector<double> time_each(const std::function<void()>& body, cudaStream_t stream, int reps) {
  std::vector<cudaEvent_t> events(2 * reps, nullptr);
  for (auto& e : events) cuda_check(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventRecord(events[2 * i], stream));
    body();
    cuda_check(cudaEventRecord(events[2 * i + 1], stream));
  }
  cuda_check(cudaStreamSynchronize(stream));
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us[i] = 1e3 * ms;
  }
  for (auto& e : events) cuda_check(cudaEventDestroy(e));
  return us;
}

double median(std::vector<double> values) {
  check(!values.empty(), "median of no values");
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  if (values.size() % 2 == 1) return *mid;
  return 0.5 * (*mid + *std::max_element(values.begin(), mid));
}

Measurement time_layer(const LayerLaunch& launch, cudaStream_t stream,
                       const TimingOptions& options) {
  launch(stream);  // first run outside capture: lazy library initialization, module loading
  cuda_check(cudaStreamSynchronize(stream));

  Measurement m;
  GraphExec exec;
  m.note = capture(launch, stream, exec);
  m.graph = m.note.empty();
  const std::function<void()> body =
      m.graph ? std::function<void()>([&] { cuda_check(cudaGraphLaunch(exec.get(), stream)); })
              : std::function<void()>([&] { launch(stream); });

  for (int i = 0; i < options.warmup; ++i) body();
  const double one_run_us = median(time_each(body, stream, 3));
  std::vector<double> us = time_each(body, stream, reps_for(one_run_us, options));
  m.reps = static_cast<int>(us.size());
  m.min_us = *std::min_element(us.begin(), us.end());
  m.median_us = median(std::move(us));
  return m;
}

}  // namespace nibble::bench
