// The tensor-parallel all-reduce over NCCL: one communicator per rank, one rank per GPU, the sum
// queued on the rank's compute stream (so CUDA graphs capture it with the ops around it). NVLink
// multicast (NVLS) is switched off before init: no multicast objects are ever created.
// Built only where CMake finds NCCL (target nibble_nccl).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <vector>

#include "model/communicator.h"

namespace nibble::cuda {

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group `id` as `rank` of `size` on the calling thread's current device; all ranks must
  // call it at once (ncclCommInitRank blocks until they have). `stream`: where the sums are queued.
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, cudaStream_t stream);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // A fresh group id, made once (by rank 0) and handed to every rank.
  static ncclUniqueId make_id();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Tensor& x) override;  // BF16 or F32 on this rank's device
  void abort() override;

 private:
  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  cudaStream_t stream_;
};

}  // namespace nibble::cuda
