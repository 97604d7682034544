// `--device cuda --tp-size N`: a TensorParallelModel whose rank r runs on GPU r, on its own
// persistent thread (which selects device r once and keeps it: its compute stream is per thread),
// with its own CudaOps, weights made on its device, and an NCCL communicator; rank 0 runs on the
// calling thread on device 0. Decode steps are recorded as one CUDA graph per rank (each with its
// all-reduces: peer to peer for small sums, NCCL for the rest, nccl_communicator.h; before each
// replay the peers copy the step's inputs from rank 0's, peer to peer). Built with nibble_nccl
// (where CMake finds NCCL).
#pragma once

#include <functional>
#include <memory>

#include "format/model_config.h"
#include "model/tensor_parallel.h"

namespace nibble::cuda {

// Fails clearly unless `tp_size` GPUs are visible ("--tp-size 2 needs 2 GPUs, 1 visible").
void check_gpu_count(int tp_size);

// Rank r's weights on its backend, called on rank r's thread (e.g. place_shard of host weights, or
// dummy weights of the rank's config).
using RankWeights = std::function<ModelWeights(int rank, const ModelConfig& rank_config, Ops& ops)>;

// `rank0_ops`: a CudaOps made on the calling thread, which must be on device 0. A rank that fails
// (a bad device, NCCL init, a CUDA error in a step) aborts every rank's communicator and the error
// is rethrown here (or by the step), never a hang.
std::unique_ptr<TensorParallelModel> make_cuda_tp_model(const ModelConfig& whole, int tp_size,
                                                        Ops& rank0_ops, const RankWeights& weights);

}  // namespace nibble::cuda
