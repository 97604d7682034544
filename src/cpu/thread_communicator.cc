// ThreadGroup's barrier and the rank-ordered CPU all-reduce.
#include "cpu/thread_communicator.h"

#include <algorithm>

#include "core/bf16.h"

namespace nibble {

ThreadGroup::ThreadGroup(int size) : size_(size), published_(static_cast<std::size_t>(size)) {
  check(size >= 1, "thread group: size ", size, " must be at least 1");
}

void ThreadGroup::arrive_and_wait() {
  std::unique_lock lock(mutex_);
  check(!aborted_, "tensor parallel: another rank failed");
  const int64_t generation = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation || aborted_; });
  check(generation_ != generation, "tensor parallel: another rank failed");
}

void ThreadGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  cv_.notify_all();
}

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {
  check(rank >= 0 && rank < group_->size(), "thread communicator: rank ", rank, " outside [0, ",
        group_->size(), ")");
}

void ThreadCommunicator::all_reduce_sum(Tensor& x) {
  check(x.device() == Device::kCpu && (x.dtype() == DType::kF32 || x.dtype() == DType::kBF16),
        "all_reduce_sum: ", x.describe(), " is not an F32 or BF16 host tensor");
  all_reduce(x, Reduce::kSum);
}

void ThreadCommunicator::all_reduce_max(Tensor& x) {
  check(x.device() == Device::kCpu && x.dtype() == DType::kF32, "all_reduce_max: ", x.describe(),
        " is not an F32 host tensor");
  all_reduce(x, Reduce::kMax);
}

void ThreadCommunicator::all_reduce(Tensor& x, Reduce op) {
  if (size() == 1) return;
  std::vector<const Tensor*>& published = group_->published();
  published[static_cast<std::size_t>(rank_)] = &x;
  group_->arrive_and_wait();  // every rank's tensor is published
  const int64_t n = x.numel();
  for (const Tensor* t : published)
    check(t->dtype() == x.dtype() && t->numel() == n, "all_reduce: rank ", rank_, " has ",
          x.describe(), ", another rank ", t->describe());
  const auto value = [](const Tensor* t, int64_t i) {
    return t->dtype() == DType::kF32 ? t->data<float>()[i] : bf16_to_float(t->data<Bf16>()[i]);
  };
  sum_.assign(static_cast<std::size_t>(n), 0.0f);
  for (int64_t i = 0; i < n; ++i) sum_[i] = value(published[0], i);
  for (std::size_t r = 1; r < published.size(); ++r)  // rank order: the same result on every rank
    for (int64_t i = 0; i < n; ++i)
      sum_[i] = op == Reduce::kSum ? sum_[i] + value(published[r], i) : std::max(sum_[i], value(published[r], i));
  group_->arrive_and_wait();  // nobody reads the published tensors any more
  if (x.dtype() == DType::kF32)
    for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = sum_[i];
  else
    for (int64_t i = 0; i < n; ++i) x.data<Bf16>()[i] = float_to_bf16(sum_[i]);
}

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size) {
  auto group = std::make_shared<ThreadGroup>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return out;
}

}  // namespace nibble
