// Device memory management: the stream-ordered pool, copies, and graph-capture allocations.
#include "cuda/device.h"

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/cuda_check.h"

namespace nibble::cuda {
namespace {

thread_local std::vector<std::shared_ptr<void>>* t_graph_blocks = nullptr;

}  // namespace

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

cudaStream_t compute_stream() {
  // One stream a device, whichever thread asks: a server's engine thread must queue its work and its
  // stream-ordered allocations on the stream the model's ops were made with, or a block freed on one
  // stream could be handed out again while the other still uses it.
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static cudaStream_t streams[kMaxDevices] = {};
  int device = 0;
  cuda_check(cudaGetDevice(&device));
  check(device >= 0 && device < kMaxDevices, "CUDA device ", device, " out of range");
  std::lock_guard lock(mutex);
  if (streams[device] == nullptr) {
    cuda_check(cudaStreamCreate(&streams[device]));
    // Keep freed blocks in the pool instead of returning them to the driver at every sync.
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = UINT64_MAX;
    cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  return streams[device];
}

int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> counts[kMaxDevices] = {};
  int device = 0;
  cuda_check(cudaGetDevice(&device));
  check(device >= 0 && device < kMaxDevices, "CUDA device ", device, " out of range");
  if (counts[device] == 0) {
    int n = 0;
    cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    counts[device] = n;
  }
  return counts[device];
}

Tensor empty(DType dtype, Shape shape) {
  const Tensor probe = Tensor::wrap(nullptr, dtype, shape, Device::kCuda, nullptr);
  const std::size_t bytes = probe.nbytes() == 0 ? 256 : static_cast<std::size_t>(probe.nbytes());
  void* p = nullptr;
  if (t_graph_blocks) {
    const cudaError_t status = cudaMalloc(&p, bytes);
    check(status == cudaSuccess, "out of GPU memory: cannot allocate ", bytes, " bytes (",
          cudaGetErrorString(status), ")");
    std::shared_ptr<void> owner(p, [](void* q) { (void)cudaFree(q); });
    t_graph_blocks->push_back(owner);
    return Tensor::wrap(p, dtype, std::move(shape), Device::kCuda, std::move(owner));
  }
  const cudaStream_t stream = compute_stream();
  const cudaError_t status = cudaMallocAsync(&p, bytes, stream);
  if (status != cudaSuccess) (void)cudaGetLastError();
  check(status == cudaSuccess, "out of GPU memory: cannot allocate ", bytes, " bytes (",
        cudaGetErrorString(status), ")");
  return Tensor::wrap(p, dtype, std::move(shape), Device::kCuda,
                      std::shared_ptr<void>(p, [stream](void* q) { (void)cudaFreeAsync(q, stream); }));
}

Tensor upload(const Tensor& host) {
  check(host.device() == Device::kCpu, "cuda::upload: ", host.describe(), " is not a host tensor");
  Tensor t = empty(host.dtype(), host.shape());
  cuda_check(cudaMemcpyAsync(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, compute_stream()));
  cuda_check(cudaStreamSynchronize(compute_stream()));
  return t;
}

Tensor download(const Tensor& device_tensor) {
  check(device_tensor.device() == Device::kCuda, "cuda::download: ", device_tensor.describe(),
        " is not a device tensor");
  Tensor t = Tensor::zeros(device_tensor.dtype(), device_tensor.shape());
  cuda_check(cudaMemcpyAsync(t.raw(), device_tensor.raw(), t.nbytes(), cudaMemcpyDeviceToHost, compute_stream()));
  cuda_check(cudaStreamSynchronize(compute_stream()));
  return t;
}

void copy_to_device(const Tensor& host, Tensor& dst) {
  check(host.device() == Device::kCpu && dst.device() == Device::kCuda && host.dtype() == dst.dtype() &&
            host.numel() == dst.numel(),
        "cuda::copy_to_device: ", host.describe(), " does not fit ", dst.describe());
  cuda_check(cudaMemcpyAsync(dst.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice, compute_stream()));
}

GraphMemory::GraphMemory() {
  check(t_graph_blocks == nullptr, "GraphMemory: nested capture scopes");
  t_graph_blocks = &blocks_;
}

GraphMemory::~GraphMemory() {
  if (active_) t_graph_blocks = nullptr;
}

std::vector<std::shared_ptr<void>> GraphMemory::release() {
  if (active_) t_graph_blocks = nullptr;
  active_ = false;
  return std::move(blocks_);
}

}  // namespace nibble::cuda
