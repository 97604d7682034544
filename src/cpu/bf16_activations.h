// Bf16ActivationOps: the CPU backend with the GPU's activation precision, the twin of CudaOps for
// end-to-end comparisons. Its activation dtype is BF16, held in real BF16 tensors: each op reads its
// inputs as F32 values, runs CpuOps on them, and stores its outputs in the dtype of the tensor the
// caller gave (BF16: rounded to nearest even, once; F32: as computed), exactly where CUDA stores BF16
// or F32 (ops.h: the residual stream and the sublayer outputs F32, the GEMMs' inputs BF16), so the two
// backends compute the same function up to summation order. Not fast: it converts on every op.
#pragma once

#include "cpu/cpu_ops.h"

namespace nibble {

class Bf16ActivationOps final : public Ops {
 public:
  Device device() const override { return cpu_.device(); }
  DType activation_dtype() const override { return DType::kBF16; }

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
};

}  // namespace nibble
