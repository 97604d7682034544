// Owned device memory for the benchmark: one cudaMalloc'd byte range, freed on destruction, and the
// small host -> device copies the harness needs outside the timed region. Not an allocator.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"

namespace nibble::bench {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    cuda_check(cudaMalloc(&data_, bytes == 0 ? 256 : bytes));
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (data_ != nullptr) (void)cudaFree(data_);  // never throw from a destructor
    data_ = nullptr;
  }

  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer upload_vector(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T));
  if (!host.empty())
    cuda_check(
        cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

}  // namespace nibble::bench
