// A one-shot all-reduce (sum, or maximum) for small messages between the GPUs of ONE process, over
// plain peer-to-peer access (NVLink), in one kernel that reduces all ranks' values in rank order (so
// every rank holds bit-identical results). Messages up to kP2pPushMaxBytes are pushed: each rank
// stores its values straight into every peer's inbox, and each rank waits on its own inbox's words
// until they are no longer the "empty" pattern, then reduces and empties them (no flags, no reads
// across NVLink). Larger ones, up to kP2pMaxBytes, are staged: each rank copies its tensor into its
// own staging buffer, flags every peer, waits for every peer's flag and reads the peers' staging.
// No host state changes per call: CUDA graphs capture it. Not NCCL and no multicast objects;
// NcclCommunicator uses it for messages up to kP2pMaxBytes.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"

namespace nibble::cuda {

constexpr int kP2pMaxRanks = 8;
constexpr int kP2pMaxBlocks = 64;               // the grid (fewer where a GPU has fewer SMs)
constexpr std::size_t kP2pMaxBytes = 4u << 20;  // the largest message: one half of a staging buffer
constexpr std::size_t kP2pPushMaxBytes = 1u << 20;  // the largest pushed message: a sender's inbox half
constexpr int64_t kP2pNormMaxCols = 8192;        // the widest row reduce_add_rms_norm takes (no spills)

// The state the ranks' threads share: each rank's device buffer once published, the setup barrier,
// and the abort flag (mapped host memory) that a kernel waiting for its peers polls.
class P2pGroup {
 public:
  explicit P2pGroup(int size);
  // Waits for every rank's device to finish its work, then frees every rank's buffer (no kernel of
  // a peer may still read one; called when the last communicator of the group is gone).
  ~P2pGroup();
  P2pGroup(const P2pGroup&) = delete;
  P2pGroup& operator=(const P2pGroup&) = delete;

  int size() const { return size_; }
  // Kernels waiting for their peers, now or later, return without reducing (x keeps this rank's
  // values); ranks waiting in setup fail with "another rank failed". Safe from any thread.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  friend class P2pAllReduce;
  struct Rank {
    int device = -1;
    std::byte* buffer = nullptr;  // cudaMalloc on `device`: the layout of p2p_all_reduce.cu
    int multiprocessors = 0;
  };
  // This rank's entry; returns every rank's once all published. Fails when the group aborts.
  std::vector<Rank> publish(int rank, const Rank& mine);
  volatile int* abort_flag();  // mapped host memory, allocated by the first rank to ask

  int size_;
  std::mutex mutex_;
  std::condition_variable published_cv_;
  int published_ = 0;
  std::vector<Rank> ranks_;
  std::atomic<bool> aborted_{false};
  volatile int* abort_flag_ = nullptr;
};

enum class P2pOp { kSum, kMax };

// The kernel's arguments (p2p_all_reduce.cu), the same for every call of a rank but x and numel.
struct P2pParams {
  void* x = nullptr;  // (numel) F32 or BF16 on this rank's device, reduced in place
  int64_t numel = 0;
  bool x_aligned = false;  // x is 16-byte aligned (vector loads and stores)
  int rank = 0, size = 0;
  std::byte* staging[kP2pMaxRanks] = {};  // each rank's 2 halves of kP2pMaxBytes (peer pointers)
  std::byte* inbox[kP2pMaxRanks] = {};    // each rank's [2][kP2pMaxRanks (sender)][kP2pPushMaxBytes]
  bool push = false;                      // this call pushes (p2p_all_reduce.cu)
  uint64_t* flags[kP2pMaxRanks] = {};  // each rank's [kP2pMaxRanks (writer), kP2pMaxBlocks] epochs
  uint64_t* epochs = nullptr;          // this rank's [kP2pMaxBlocks]: the last epoch each block ran
  const volatile int* abort_flag = nullptr;
};

// The residual add and RMSNorm after a sum (P2pAllReduce::reduce_add_rms_norm).
struct P2pNormArgs {
  float* residual = nullptr;          // (rows, cols) F32, += the sum (normalized with post_weight if set)
  const void* post_weight = nullptr;  // (cols) BF16, or null
  const void* weight = nullptr;       // (cols) BF16
  void* out = nullptr;           // (rows, cols) BF16: rms_norm(residual) · weight
  int64_t rows = 0, cols = 0;
  float eps = 0.0f;
};

class P2pAllReduce {
 public:
  // Joins `group` as `rank` on the calling thread's current device; all ranks at once, each on its
  // own thread. Enabled only when every pair of the ranks' devices can access each other (then peer
  // access is enabled here for this device); otherwise enabled() is false on every rank.
  P2pAllReduce(std::shared_ptr<P2pGroup> group, int rank);

  bool enabled() const { return enabled_; }
  bool pushes() const { return push_; }  // messages up to kP2pPushMaxBytes pushed (NIBBLE_P2P_PUSH)
  // Whether reduce() takes x: enabled, at most kP2pMaxBytes on the device, F32 or BF16 for kSum,
  // F32 for kMax.
  bool fits(const Tensor& x, P2pOp op) const;
  // x = the sum (F32 sums, then rounded to x's dtype) or maximum over ranks of x, combined in rank
  // order, queued on `stream`. Every rank must make the same calls with tensors of the same dtype
  // and element count, in the same order, each rank's calls on one stream (the reuse argument in
  // p2p_all_reduce.cu rests on it).
  void reduce(Tensor& x, P2pOp op, cudaStream_t stream) const;
  // Whether reduce_add_rms_norm takes y: enabled, F32 (T, H) on the device of at most kP2pMaxBytes,
  // H a multiple of 8 up to kP2pNormMaxCols, 16-byte aligned.
  bool fits_add_rms_norm(const Tensor& y) const;
  // residual (F32, y's shape) += the sum over ranks of y (F32 sums in rank order), then out (BF16) =
  // rms_norm(residual) · weight (BF16 (H)): the values of reduce(y, kSum) then add_rms_norm
  // (basic_ops.h) bit for bit, in one kernel; y keeps this rank's values. With post_weight (BF16 (H)),
  // residual += rms_norm(sum) · post_weight rounded to BF16, as rms_norm then add_rms_norm would. The
  // rules of reduce apply, and both kinds of call share the epochs.
  void reduce_add_rms_norm(const Tensor& y, Tensor& residual, const Tensor* post_weight, const Tensor& weight,
                           float eps, Tensor& out, cudaStream_t stream) const;

 private:
  std::shared_ptr<P2pGroup> group_;
  bool enabled_ = false;
  bool push_ = false;
  int grid_ = 0;
  P2pParams params_;
};

// The kernel launch (p2p_all_reduce.cu): `grid` blocks, the same on every rank.
enum class P2pDType { kF32, kBF16 };
void launch_p2p_all_reduce(const P2pParams& params, P2pDType dtype, P2pOp op, int grid,
                           cudaStream_t stream);
// Queues the fill of `words` 32-bit words at `inbox` (device memory) with the empty pattern of pushed
// messages; the launch's status.
cudaError_t fill_p2p_inbox(void* inbox, std::size_t words, cudaStream_t stream);
void launch_p2p_all_reduce_add_rms_norm(const P2pParams& params, const P2pNormArgs& norm, int grid,
                                        cudaStream_t stream);

}  // namespace nibble::cuda
