// CpuOps: the plain reference implementation of Ops, and the oracle every CUDA kernel is tested
// against. Activations are F32; the KV cache is BF16 or FP8 exactly as on the GPU. Clarity over speed.
#pragma once

#include "model/memory_plan.h"
#include "model/ops.h"

namespace nibble {

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }

  Tensor empty(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host) override;
  Tensor download(const Tensor& device_tensor) override;
  MemoryInfo memory_info() const override { return host_memory_info(); }

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void scale(Tensor& x, float factor) override;
  void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) override;
  void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) override;
  void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params,
            double theta) override;
  void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                 const ForwardBatch& batch, const AttentionParams& params, Tensor& out) override;
  void moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) override;
};

}  // namespace nibble
