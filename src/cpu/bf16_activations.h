// Bf16ActivationOps: the CPU backend with the GPU's activation precision. It runs CpuOps and rounds
// every activation an op writes to the nearest BF16 value (kept in F32 tensors), as the CUDA backend
// stores them, so the two backends compute the same function up to summation order: the twin for
// end-to-end comparisons (`--dtype bfloat16` on the CPU). Logits stay F32 as on the GPU, and so do a
// tensor-parallel rank's partial sums (o_proj with a row_group, the MoE with a communicator): as on
// the GPU, add and rms_norm round their sum to BF16 as they read it.
#pragma once

#include "cpu/cpu_ops.h"

namespace nibble {

class Bf16ActivationOps final : public Ops {
 public:
  Device device() const override { return cpu_.device(); }
  DType activation_dtype() const override { return cpu_.activation_dtype(); }

  Tensor empty(DType dtype, Shape shape) override { return cpu_.empty(dtype, std::move(shape)); }
  Tensor upload(const Tensor& host) override { return cpu_.upload(host); }
  Tensor download(const Tensor& device_tensor) override { return cpu_.download(device_tensor); }
  MemoryInfo memory_info() const override { return cpu_.memory_info(); }
  MoeWeights prepare_moe(const MoeWeights& host) override { return cpu_.prepare_moe(host); }

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void scale(Tensor& x, float factor) override;
  void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) override;
  void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) override;
  void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) override;
  void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                 const AttentionParams& params, Tensor& out) override;
  void moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) override;

 private:
  CpuOps cpu_;
  const void* last_logits_ = nullptr;  // scale() on the logits (Grok's output multiplier) stays F32
};

}  // namespace nibble
