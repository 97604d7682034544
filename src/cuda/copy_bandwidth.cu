// Copy bandwidth: two buffers of random words, event-timed copies, the median.
#include "cuda/copy_bandwidth.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace nibble::cuda {
namespace {

constexpr int kWarmup = 3;

__global__ void fill_words(uint64_t* out, std::size_t n) {  // never zeros: splitmix64 of the index
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    out[i] = z ^ (z >> 31);
  }
}

std::shared_ptr<void> device_bytes(int64_t bytes) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, static_cast<std::size_t>(bytes)));
  return {p, [](void* q) { (void)cudaFree(q); }};
}

struct Event {
  Event() { cuda_check(cudaEventCreate(&event)); }
  ~Event() { (void)cudaEventDestroy(event); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t event = nullptr;
};

}  // namespace

CopyBandwidth measure_copy_bandwidth(int64_t bytes, int reps, cudaStream_t stream) {
  check(bytes >= 8 && reps >= 1, "measure_copy_bandwidth: need at least 8 bytes and one run");
  bytes = bytes / 8 * 8;
  const auto n = static_cast<std::size_t>(bytes);
  const std::shared_ptr<void> src = device_bytes(bytes), dst = device_bytes(bytes);
  fill_words<<<1024, 256, 0, stream>>>(static_cast<uint64_t*>(src.get()), n / 8);
  cuda_check(cudaGetLastError());
  const auto copy = [&] {
    cuda_check(cudaMemcpyAsync(dst.get(), src.get(), n, cudaMemcpyDeviceToDevice, stream));
  };
  for (int i = 0; i < kWarmup; ++i) copy();

  std::vector<Event> starts(reps), ends(reps);
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventRecord(starts[i].event, stream));
    copy();
    cuda_check(cudaEventRecord(ends[i].event, stream));
  }
  cuda_check(cudaStreamSynchronize(stream));
  std::vector<double> seconds(reps);
  for (int i = 0; i < reps; ++i) {
    float ms = 0.0f;
    cuda_check(cudaEventElapsedTime(&ms, starts[i].event, ends[i].event));
    seconds[i] = 1e-3 * ms;
  }
  std::sort(seconds.begin(), seconds.end());
  const double median =
      reps % 2 == 1 ? seconds[reps / 2] : 0.5 * (seconds[reps / 2 - 1] + seconds[reps / 2]);
  return {
      .gb_per_s = 2.0 * static_cast<double>(bytes) / median / 1e9, .bytes = bytes, .reps = reps};
}

}  // namespace nibble::cuda
