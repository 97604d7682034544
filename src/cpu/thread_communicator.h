// Tensor parallelism on the CPU: N ranks as N threads of one process. Each rank publishes its
// tensor's address, waits for the others, sums (or takes the maximum of) all of them in rank order (so every rank computes the
// same bits) into its own scratch, waits again, then writes the sum back. Exact and deterministic.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "model/communicator.h"

namespace nibble {

// The state N ThreadCommunicators share: the published tensors and an abortable barrier.
class ThreadGroup {
 public:
  explicit ThreadGroup(int size);
  int size() const { return size_; }
  // Blocks until all `size` ranks arrive; fails on every rank once any rank aborted.
  void arrive_and_wait();
  void abort();
  std::vector<const Tensor*>& published() { return published_; }

 private:
  int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const Tensor*> published_;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void all_reduce_sum(Tensor& x) override;  // F32 or BF16 host tensors
  void all_reduce_max(Tensor& x) override;  // F32 host tensors
  void abort() override { group_->abort(); }

 private:
  enum class Reduce : uint8_t { kSum, kMax };
  void all_reduce(Tensor& x, Reduce op);

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::vector<float> sum_;
};

// `size` communicators over one new group, rank r at index r.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size);

}  // namespace nibble
