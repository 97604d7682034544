// Device memory management.
#include "cuda/device.h"

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace nibble::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

Tensor empty(DType dtype, Shape shape) {
  const Tensor probe = Tensor::wrap(nullptr, dtype, shape, Device::kCuda, nullptr);
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, probe.nbytes() == 0 ? 256 : probe.nbytes()));
  return Tensor::wrap(p, dtype, std::move(shape), Device::kCuda,
                      std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); }));
}

Tensor upload(const Tensor& host) {
  check(host.device() == Device::kCpu, "cuda::upload: ", host.describe(), " is not a host tensor");
  Tensor t = empty(host.dtype(), host.shape());
  cuda_check(cudaMemcpy(t.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
  return t;
}

Tensor download(const Tensor& device_tensor) {
  check(device_tensor.device() == Device::kCuda, "cuda::download: ", device_tensor.describe(),
        " is not a device tensor");
  Tensor t = Tensor::zeros(device_tensor.dtype(), device_tensor.shape());
  cuda_check(cudaMemcpy(t.raw(), device_tensor.raw(), t.nbytes(), cudaMemcpyDeviceToHost));
  return t;
}

}  // namespace nibble::cuda
