// P2pGroup and P2pAllReduce: each rank's device buffer, the exchange of the buffers' addresses
// between the rank threads (one process, unified addressing), peer access, the abort flag, and the
// launch parameters of every call. The kernel is in p2p_all_reduce.cu.
#include "cuda/p2p_all_reduce.h"

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"

namespace nibble::cuda {
namespace {

// A rank's buffer: [2][kP2pMaxBytes] staging | [kP2pMaxRanks][kP2pMaxBlocks] flags |
// [kP2pMaxBlocks] epochs, all zero at first (flags and epochs are uint64) | [2][kP2pMaxRanks]
// [kP2pPushMaxBytes] inbox, empty at first (p2p_all_reduce.cu).
constexpr std::size_t kFlagsOffset = 2 * kP2pMaxBytes;
constexpr std::size_t kEpochsOffset =
    kFlagsOffset + sizeof(uint64_t) * kP2pMaxRanks * kP2pMaxBlocks;
constexpr std::size_t kInboxOffset = kEpochsOffset + sizeof(uint64_t) * kP2pMaxBlocks;
constexpr std::size_t kInboxBytes = 2 * kP2pMaxRanks * kP2pPushMaxBytes;
constexpr std::size_t kBufferBytes = kInboxOffset + kInboxBytes;
static_assert(kInboxOffset % 16 == 0);

}  // namespace

P2pGroup::P2pGroup(int size) : size_(size) {
  check(size >= 1, "peer-to-peer all-reduce: group size ", size, " must be at least 1");
  ranks_.resize(static_cast<std::size_t>(size));
}

P2pGroup::~P2pGroup() {
  if (abort_flag_ == nullptr) return;  // no rank got as far as allocating
  int current = -1;
  const bool has_current = cudaGetDevice(&current) == cudaSuccess;
  for (const Rank& r : ranks_)
    if (r.buffer != nullptr && cudaSetDevice(r.device) == cudaSuccess)
      (void)cudaDeviceSynchronize();
  for (const Rank& r : ranks_)
    if (r.buffer != nullptr && cudaSetDevice(r.device) == cudaSuccess) (void)cudaFree(r.buffer);
  (void)cudaFreeHost(const_cast<int*>(abort_flag_));
  if (has_current) (void)cudaSetDevice(current);
  (void)cudaGetLastError();  // a failed group's errors stay with it
}

void P2pGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  if (abort_flag_ != nullptr) *abort_flag_ = 1;
  published_cv_.notify_all();
}

volatile int* P2pGroup::abort_flag() {
  std::lock_guard lock(mutex_);
  if (abort_flag_ == nullptr) {
    void* host = nullptr;
    cuda_check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    abort_flag_ = static_cast<volatile int*>(host);
    *abort_flag_ = aborted_ ? 1 : 0;
  }
  return abort_flag_;
}

std::vector<P2pGroup::Rank> P2pGroup::publish(int rank, const Rank& mine) {
  std::unique_lock lock(mutex_);
  ranks_[static_cast<std::size_t>(rank)] = mine;
  ++published_;
  published_cv_.notify_all();
  published_cv_.wait(lock, [&] { return published_ == size_ || aborted_; });
  check(!aborted_, "tensor parallel: another rank failed");
  return ranks_;
}

P2pAllReduce::P2pAllReduce(std::shared_ptr<P2pGroup> group, int rank) : group_(std::move(group)) {
  const int n = group_->size();
  check(rank >= 0 && rank < n, "peer-to-peer all-reduce: rank ", rank, " outside [0, ", n, ")");
  P2pGroup::Rank mine;
  cuda_check(cudaGetDevice(&mine.device));
  cuda_check(
      cudaDeviceGetAttribute(&mine.multiprocessors, cudaDevAttrMultiProcessorCount, mine.device));
  void* buffer = nullptr;
  cuda_check(cudaMalloc(&buffer, kBufferBytes));
  mine.buffer = static_cast<std::byte*>(buffer);
  // Zeroed and the inbox emptied before any peer can write here: the peers start only after publish().
  cudaError_t zeroed = cudaMemset(buffer, 0, kInboxOffset);
  if (zeroed == cudaSuccess) zeroed = fill_p2p_inbox(mine.buffer + kInboxOffset, kInboxBytes / 4, nullptr);
  const cudaError_t synced = cudaDeviceSynchronize();
  if (zeroed != cudaSuccess || synced != cudaSuccess) {
    (void)cudaFree(buffer);
    cuda_check(zeroed != cudaSuccess ? zeroed : synced);
  }
  volatile int* abort_flag = nullptr;
  try {
    abort_flag = group_->abort_flag();
  } catch (...) {
    (void)cudaFree(buffer);
    throw;
  }
  // From here on the group frees the buffer.
  const std::vector<P2pGroup::Rank> ranks = group_->publish(rank, mine);

  // Every rank decides alike from the same devices: each pair on two devices must reach the other
  // directly (ranks may share a device: the tests run two ranks on one GPU).
  bool reachable = n <= kP2pMaxRanks;
  for (int i = 0; i < n && reachable; ++i)
    for (int j = 0; j < n && reachable; ++j) {
      if (ranks[i].device == ranks[j].device) continue;
      int access = 0;
      cuda_check(cudaDeviceCanAccessPeer(&access, ranks[i].device, ranks[j].device));
      reachable = access != 0;
    }
  if (!reachable || n == 1) return;
  for (int j = 0; j < n; ++j) {
    if (ranks[j].device == mine.device) continue;
    const cudaError_t status = cudaDeviceEnablePeerAccess(ranks[j].device, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();  // enabled before (an earlier group, or NCCL): fine, and not sticky
    else
      cuda_check(status);
  }
  grid_ = kP2pMaxBlocks;
  for (const P2pGroup::Rank& r : ranks) grid_ = std::min(grid_, r.multiprocessors);  // co-resident
  params_.rank = rank;
  params_.size = n;
  // NIBBLE_P2P_PUSH=0 stages every message (every rank reads the same environment).
  push_ = env_choice("NIBBLE_P2P_PUSH", {"0", "1"}) != "0";
  for (int j = 0; j < n; ++j) {
    params_.staging[j] = ranks[j].buffer;
    params_.inbox[j] = ranks[j].buffer + kInboxOffset;
    params_.flags[j] = reinterpret_cast<uint64_t*>(ranks[j].buffer + kFlagsOffset);
  }
  params_.epochs = reinterpret_cast<uint64_t*>(mine.buffer + kEpochsOffset);
  void* device_flag = nullptr;
  cuda_check(cudaHostGetDevicePointer(&device_flag, const_cast<int*>(abort_flag), 0));
  params_.abort_flag = static_cast<const volatile int*>(device_flag);
  enabled_ = true;
}

bool P2pAllReduce::fits(const Tensor& x, P2pOp op) const {
  const bool dtype_ok =
      x.dtype() == DType::kF32 || (op == P2pOp::kSum && x.dtype() == DType::kBF16);
  return enabled_ && dtype_ok && x.device() == Device::kCuda && x.nbytes() <= kP2pMaxBytes;
}

void P2pAllReduce::reduce(Tensor& x, P2pOp op, cudaStream_t stream) const {
  check(fits(x, op), "peer-to-peer all-reduce: ", x.describe(),
        " is not a device tensor of at most ", kP2pMaxBytes,
        " bytes of a dtype this reduction takes");
  if (x.numel() == 0) return;  // on every rank alike: the same element counts
  P2pParams p = params_;
  p.x = x.raw();
  p.numel = x.numel();
  p.x_aligned = reinterpret_cast<std::uintptr_t>(x.raw()) % 16 == 0;
  p.push = push_ && x.nbytes() <= kP2pPushMaxBytes;
  const P2pDType dtype = x.dtype() == DType::kBF16 ? P2pDType::kBF16 : P2pDType::kF32;
  launch_p2p_all_reduce(p, dtype, op, grid_, stream);
}

bool P2pAllReduce::fits_add_rms_norm(const Tensor& y) const {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return enabled_ && y.dtype() == DType::kF32 && y.device() == Device::kCuda && y.rank() == 2 &&
         y.nbytes() <= kP2pMaxBytes && y.dim(1) % 8 == 0 && y.dim(1) <= kP2pNormMaxCols && aligned(y.raw());
}

void P2pAllReduce::reduce_add_rms_norm(const Tensor& y, Tensor& residual, const Tensor* post_weight,
                                       const Tensor& weight, float eps, Tensor& out, cudaStream_t stream) const {
  check(fits_add_rms_norm(y), "peer-to-peer all-reduce + norm: ", y.describe(),
        " is not an aligned F32 (T, H) device tensor of at most ", kP2pMaxBytes, " bytes, H % 8 == 0");
  const int64_t T = y.dim(0), H = y.dim(1);
  expect(residual, DType::kF32, {T, H}, "peer-to-peer all-reduce + norm residual");
  expect(weight, DType::kBF16, {H}, "peer-to-peer all-reduce + norm weight");
  if (post_weight != nullptr) expect(*post_weight, DType::kBF16, {H}, "peer-to-peer all-reduce + norm post weight");
  expect(out, DType::kBF16, {T, H}, "peer-to-peer all-reduce + norm output");
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  check(aligned(residual.raw()) && aligned(weight.raw()) && aligned(out.raw()) &&
            (post_weight == nullptr || aligned(post_weight->raw())),
        "peer-to-peer all-reduce + norm: a tensor is not 16-byte aligned");
  if (T == 0) return;  // on every rank alike: the same shapes
  P2pParams p = params_;
  p.x = const_cast<void*>(y.raw());  // read only: the norm kernel writes residual and out
  p.numel = y.numel();
  p.x_aligned = true;
  p.push = push_ && y.nbytes() <= kP2pPushMaxBytes;
  const P2pNormArgs norm{.residual = residual.data<float>(),
                         .post_weight = post_weight != nullptr ? post_weight->raw() : nullptr,
                         .weight = weight.raw(),
                         .out = out.raw(),
                         .rows = T,
                         .cols = H,
                         .eps = eps};
  launch_p2p_all_reduce_add_rms_norm(p, norm, grid_, stream);
}

}  // namespace nibble::cuda
