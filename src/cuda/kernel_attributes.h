// Kernel function attributes are per device: a limit set while device 0 was current does not hold
// for a launch on device 1 (tensor parallelism runs one rank a device). This sets a kernel's dynamic
// shared-memory limit once for each device it is launched on.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <set>
#include <utility>

#include "cuda/cuda_check.h"

namespace nibble::cuda {

inline void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device)
  int device = 0;
  cuda_check(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  if (done.insert({kernel, device}).second)
    cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace nibble::cuda
