// The tensor-parallel collectives over NCCL: one communicator per rank, one rank per GPU, the sums
// and maxima queued on the rank's compute stream (so CUDA graphs capture them with the ops around
// them). The communicators are non-blocking: initialization and the first collectives (which
// connect the ranks) poll instead of waiting, so a group whose rank failed ends with an error,
// never a hang; NcclGroup::abort aborts every rank's communicator (also the kernels of a rank stuck
// in a collective its failed peer never joined). NVLink multicast (NVLS) is switched off before
// init: no multicast objects are ever created. Sums and maxima of at most kP2pMaxBytes go through
// the peer-to-peer all-reduce (p2p_all_reduce.h) where every pair of GPUs can access each other,
// unless NIBBLE_P2P_ALLREDUCE=0 (NCCL for every collective: for A/B timing). Built only where CMake
// finds NCCL (target nibble_nccl).
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/p2p_all_reduce.h"
#include "cuda/residual_norm_all_reduce.h"
#include "model/communicator.h"

namespace nibble::cuda {

// Who reduces small messages: the peer-to-peer all-reduce (where the GPUs allow it) or NCCL.
enum class SmallMessages { kPeerToPeer, kNccl };
// kNccl when NIBBLE_P2P_ALLREDUCE=0, else kPeerToPeer.
SmallMessages small_messages_from_environment();

// The ranks of one process that form one NCCL group: the id rank 0 made, and each rank's
// communicator once it joined, so that any rank can abort all of them.
class NcclGroup {
 public:
  // A fresh id; sets NCCL_NVLS_ENABLE=0 (call before any rank joins).
  explicit NcclGroup(int size, SmallMessages small_messages = small_messages_from_environment());
  int size() const { return size_; }
  const ncclUniqueId& id() const { return id_; }
  bool aborted() const { return aborted_.load(); }
  // Every rank's communicator is aborted (pending collectives on the devices end, peer-to-peer ones
  // included); rank threads waiting in init or in a collective fail with "another rank failed".
  // Safe from any thread.
  void abort();

 private:
  friend class NcclCommunicator;
  struct Slot {
    std::mutex mutex;  // held around every NCCL call on `comm`
    ncclComm_t comm = nullptr;
  };
  int size_;
  ncclUniqueId id_{};
  std::atomic<bool> aborted_{false};
  std::vector<std::unique_ptr<Slot>> slots_;
  std::shared_ptr<P2pGroup> p2p_;  // null: NCCL sums everything
};

class NcclCommunicator final : public Communicator, public ResidualNormAllReduce {
 public:
  // Joins `group` as `rank` on the calling thread's current device; all ranks must call it at
  // once, each on its own thread. Fails (and aborts the group) when init fails or the group aborts.
  // `stream`: where the collectives are queued.
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, cudaStream_t stream);
  // Destroys the communicator: call on every rank at once (NCCL finalizes them together).
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void all_reduce_sum(Tensor& x) override;  // BF16 or F32 on this rank's device
  void all_reduce_max(Tensor& x) override;  // F32 on this rank's device
  // Peer to peer where the sum fits (P2pAllReduce::fits_add_rms_norm); else false.
  bool all_reduce_add_rms_norm(Tensor& y, Tensor& residual, const Tensor* post_weight, const Tensor& weight, float eps,
                               Tensor& out) override;
  void abort() override { group_->abort(); }
  // Whether sums and maxima of at most kP2pMaxBytes go peer to peer (asked for, and the GPUs allow
  // it).
  bool peer_to_peer_enabled() const { return p2p_ != nullptr && p2p_->enabled(); }

 private:
  void all_reduce(Tensor& x, ncclRedOp_t op);
  // Reduces x peer to peer where it fits (p2p_all_reduce.h); false: NCCL's to do.
  bool reduce_peer_to_peer(Tensor& x, P2pOp op);
  // Waits, without blocking in NCCL, until the communicator's last call completed; fails if it
  // failed or the group aborted. Holds no lock while it waits.
  void wait_ready(const char* what);

  std::shared_ptr<NcclGroup> group_;
  int rank_;
  cudaStream_t stream_;
  std::unique_ptr<P2pAllReduce> p2p_;
};

}  // namespace nibble::cuda
