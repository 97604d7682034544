// NcclGroup and NcclCommunicator: non-blocking init with NVLS off, the in-place sum and maximum, and
// the group-wide abort for a failed rank.
#include "cuda/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"
#include "cuda/launch.h"

namespace nibble::cuda {
namespace {

void nccl_check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess && status != ncclInProgress)
    fail("NCCL ", what, " failed: ", ncclGetErrorString(status));
}

}  // namespace

SmallMessages small_messages_from_environment() {
  return env_choice("NIBBLE_P2P_ALLREDUCE", {"0", "1"}) == "0" ? SmallMessages::kNccl : SmallMessages::kPeerToPeer;
}

NcclGroup::NcclGroup(int size, SmallMessages small_messages) : size_(size) {
  check(size >= 1, "NCCL: group size ", size, " must be at least 1");
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
  nccl_check(ncclGetUniqueId(&id_), "ncclGetUniqueId");
  for (int r = 0; r < size; ++r) slots_.push_back(std::make_unique<Slot>());
  if (small_messages == SmallMessages::kPeerToPeer && size > 1)
    p2p_ = std::make_shared<P2pGroup>(size);
}

void NcclGroup::abort() {
  aborted_ = true;
  if (p2p_) p2p_->abort();  // first: peer-to-peer kernels waiting for a failed rank return
  for (auto& slot : slots_) {
    std::lock_guard lock(slot->mutex);
    if (slot->comm != nullptr) (void)ncclCommAbort(slot->comm);
    slot->comm = nullptr;
  }
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclGroup> group, int rank, cudaStream_t stream)
    : group_(std::move(group)), rank_(rank), stream_(stream) {
  check(rank >= 0 && rank < group_->size(), "NCCL: rank ", rank, " outside [0, ", group_->size(), ")");
  NcclGroup::Slot& slot = *group_->slots_[static_cast<std::size_t>(rank)];
  try {
    {
      std::lock_guard lock(slot.mutex);
      check(!group_->aborted(), "tensor parallel: another rank failed");
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;  // init and collectives poll (wait_ready), so an abort always ends them
      ncclComm_t comm = nullptr;
      const ncclResult_t status = ncclCommInitRankConfig(&comm, group_->size(), group_->id(), rank, &config);
      slot.comm = comm;
      nccl_check(status, "ncclCommInitRankConfig");
    }
    wait_ready("ncclCommInitRankConfig");
    // With the other ranks (each waits for all to publish their buffers).
    if (group_->p2p_) p2p_ = std::make_unique<P2pAllReduce>(group_->p2p_, rank);
  } catch (...) {
    group_->abort();
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  NcclGroup::Slot& slot = *group_->slots_[static_cast<std::size_t>(rank_)];
  // Finalize (with the other ranks: every rank's destructor runs at once), polling as the
  // communicator is non-blocking; an abort of the group meanwhile ends the wait.
  {
    std::lock_guard lock(slot.mutex);
    if (slot.comm == nullptr) return;
    const ncclResult_t status = group_->aborted() ? ncclInternalError : ncclCommFinalize(slot.comm);
    if (status != ncclSuccess && status != ncclInProgress) {
      (void)ncclCommAbort(slot.comm);
      slot.comm = nullptr;
      return;
    }
  }
  for (;;) {
    {
      std::lock_guard lock(slot.mutex);
      if (slot.comm == nullptr) return;  // aborted
      ncclResult_t state = ncclSuccess;
      (void)ncclCommGetAsyncError(slot.comm, &state);
      if (state != ncclInProgress) {
        if (state == ncclSuccess && !group_->aborted())
          (void)ncclCommDestroy(slot.comm);
        else
          (void)ncclCommAbort(slot.comm);
        slot.comm = nullptr;
        return;
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclCommunicator::wait_ready(const char* what) {
  NcclGroup::Slot& slot = *group_->slots_[static_cast<std::size_t>(rank_)];
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard lock(slot.mutex);
      check(slot.comm != nullptr && !group_->aborted(), "tensor parallel: another rank failed");
      ncclResult_t state = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(slot.comm, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail("NCCL ", what, " failed on rank ", rank_, ": ", ncclGetErrorString(state));
    }
    if (polls > 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void NcclCommunicator::all_reduce(Tensor& x, ncclRedOp_t op) {
  if (group_->size() == 1) return;
  NcclGroup::Slot& slot = *group_->slots_[static_cast<std::size_t>(rank_)];
  const ncclDataType_t type = x.dtype() == DType::kBF16 ? ncclBfloat16 : ncclFloat32;
  {
    std::lock_guard lock(slot.mutex);
    check(slot.comm != nullptr && !group_->aborted(), "tensor parallel: another rank failed");
    nccl_check(ncclAllReduce(x.raw(), x.raw(), static_cast<std::size_t>(x.numel()), type, op, slot.comm, stream_),
               "ncclAllReduce");
  }
  wait_ready("ncclAllReduce");  // at once in steady state; the first calls connect the ranks
}

void NcclCommunicator::all_reduce_sum(Tensor& x) {
  check(x.device() == Device::kCuda && (x.dtype() == DType::kBF16 || x.dtype() == DType::kF32),
        "NCCL all_reduce_sum: ", x.describe(), " is not a BF16 or F32 device tensor");
  if (!reduce_peer_to_peer(x, P2pOp::kSum)) all_reduce(x, ncclSum);
}

void NcclCommunicator::all_reduce_max(Tensor& x) {
  check(x.device() == Device::kCuda && x.dtype() == DType::kF32, "NCCL all_reduce_max: ", x.describe(),
        " is not an F32 device tensor");
  if (!reduce_peer_to_peer(x, P2pOp::kMax)) all_reduce(x, ncclMax);
}

bool NcclCommunicator::all_reduce_add_rms_norm(Tensor& y, Tensor& residual, const Tensor* post_weight,
                                               const Tensor& weight, float eps, Tensor& out) {
  const PlainLaunches plain(plain_site("allreduce") || plain_site("allreduce-sum"));
  // The same choice on every rank: the same shapes.
  if (group_->size() == 1 || p2p_ == nullptr || !p2p_->fits_add_rms_norm(y)) return false;
  check(!group_->aborted(), "tensor parallel: another rank failed");
  p2p_->reduce_add_rms_norm(y, residual, post_weight, weight, eps, out, stream_);
  return true;
}

bool NcclCommunicator::reduce_peer_to_peer(Tensor& x, P2pOp op) {
  const PlainLaunches plain(plain_site("allreduce") ||
                            plain_site(op == P2pOp::kSum ? "allreduce-sum" : "allreduce-max"));
  // The same choice on every rank: the same dtypes and sizes.
  if (group_->size() == 1 || p2p_ == nullptr || !p2p_->fits(x, op)) return false;
  check(!group_->aborted(), "tensor parallel: another rank failed");
  p2p_->reduce(x, op, stream_);
  return true;
}

}  // namespace nibble::cuda
