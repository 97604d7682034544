// CUDA device memory as Tensors: allocation, host <-> device copies, and whether a GPU is present.
// Every allocation, copy and op is ordered on one stream (compute_stream): allocations come from the
// stream-ordered pool (cudaMallocAsync), so freeing a tensor inside a step never synchronizes the
// device. While a CUDA graph is being captured, allocations are pinned to the graph instead
// (GraphMemory). Host code only; kernels live one op per .cu file beside this.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace nibble::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int device_count();

// The stream of the current device's work, the same for every thread: created on first use, never
// destroyed, and blocking (so it is ordered with the legacy default stream that tests and libraries
// may use).
cudaStream_t compute_stream();

// Streaming multiprocessors of the current device (asked once a device).
int multiprocessor_count();

Tensor empty(DType dtype, Shape shape);  // uninitialized device memory
Tensor upload(const Tensor& host);       // synchronous
Tensor download(const Tensor& device_tensor);  // waits for the work queued on compute_stream
// dst (device) = host, same dtype and element count, queued on compute_stream (host memory must stay
// valid until the stream reaches the copy; pageable memory is staged by the driver at once).
void copy_to_device(const Tensor& host, Tensor& dst);

// Device allocations made on this thread while a GraphMemory is alive are plain cudaMalloc blocks owned
// by it as well as by their tensors: a captured graph keeps using them after the tensors are gone.
class GraphMemory {
 public:
  GraphMemory();
  ~GraphMemory();
  GraphMemory(const GraphMemory&) = delete;
  GraphMemory& operator=(const GraphMemory&) = delete;
  // Ends the capture scope and hands over the blocks (to keep with the graph).
  std::vector<std::shared_ptr<void>> release();

 private:
  std::vector<std::shared_ptr<void>> blocks_;
  bool active_ = true;
};

}  // namespace nibble::cuda
