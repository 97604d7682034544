// Communicator: the collective the tensor-parallel forward pass needs, one object per rank.
// all_reduce_sum leaves every rank holding the elementwise sum of the ranks' tensors, identical on
// every rank. Implementations: src/cpu/thread_communicator.h (N threads, one process), src/cuda/nccl_communicator.h.
#pragma once

#include "core/tensor.h"

namespace nibble {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x (any shape, the backend's activation dtype, on this rank's device) = Σ over ranks of x, in place.
  virtual void all_reduce_sum(Tensor& x) = 0;
  // x (any shape, F32, on this rank's device) = the elementwise maximum over ranks, in place (the
  // FP8 quantizers' row amax when each rank holds a slice of the row).
  virtual void all_reduce_max(Tensor& x) = 0;
  // Called by a rank that failed: the other ranks' pending and later collectives fail instead of
  // waiting for it forever.
  virtual void abort() = 0;
};

}  // namespace nibble
