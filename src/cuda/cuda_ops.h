// CudaOps: the Ops interface on one GPU (BF16 activations). Each op is a kernel file of src/cuda;
// this class owns the stream, the cuBLAS handle and the scratch the ops reuse between calls.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "cuda/linear.h"
#include "cuda/moe.h"
#include "cuda/moe_bf16.h"
#include "model/ops.h"

namespace nibble::cuda {

class CudaOps final : public Ops {
 public:
  CudaOps();
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return DType::kBF16; }

  Tensor empty(DType dtype, Shape shape) override;
  Tensor upload(const Tensor& host) override;
  Tensor download(const Tensor& device_tensor) override;
  MemoryInfo memory_info() const override;  // cudaMemGetInfo
  MoeWeights prepare_moe(const MoeWeights& host) override;
  void copy_to_device(const Tensor& host, Tensor& dst) override;
  std::unique_ptr<RecordedStep> record(const std::function<void()>& step) override;

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add(Tensor& x, const Tensor& y) override;
  void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out) override;
  // In one kernel where the communicator offers it (residual_norm_all_reduce.h): without a post-norm
  // unless NIBBLE_TP_FUSED_NORM=0, with one (sandwich norms) where NIBBLE_TP_FUSED_NORM=all (Grok-1 tp 2
  // batch 32: 29.33 ms a step against 29.18 without, fifteenth session); else the sum, then the norms.
  void all_reduce_add_rms_norm(Communicator& group, Tensor& y, Tensor& x, const Tensor* post_weight,
                               const Tensor& weight, float eps, Tensor& out) override;
  void scale(Tensor& x, float factor) override;
  void argmax(const Tensor& x, Tensor& out) override;
  // On the device (sampling.h; CudaSampling.GumbelSampleMatchesHost and FilteredSampleMatchesHost check
  // it against the host, token for token): a batch with top-k or top-p settings through the filtered
  // kernel, else the plain one. NIBBLE_DEVICE_SAMPLING=0: the host's Ops::sample on downloaded logits.
  void sample(const Tensor& logits, const SampleSettings& settings, Tensor& out) override;
  void penalize(Tensor& logits, const PenaltySettings& settings) override;  // logit_penalties.h
  void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) override;
  void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) override;
  void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) override;
  void rope_attention(Tensor& qkv, double theta, KvCacheLayer& cache, KvCacheDType cache_dtype,
                      const ForwardBatch& batch, const AttentionParams& params, Tensor& out) override;
  void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                 const AttentionParams& params, Tensor& out) override;
  void moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) override;

  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  Tensor cublas_workspace_;  // U8: given to cuBLAS so it never allocates (CUDA graph capture)
  LinearWorkspace linear_ws_;
  // RoPE's inverse frequencies for (theta, head_dim), uploaded once.
  const Tensor& inv_freq(double theta, int64_t head_dim);
  std::map<std::pair<double, int64_t>, Tensor> inv_freq_;  // (theta, head_dim) -> F32 (head_dim / 2)
  std::unique_ptr<MoeWorkspace> moe_ws_;
  MoeBf16Workspace moe_bf16_ws_;
  std::vector<std::unique_ptr<MoeWorkspace>> retired_moe_ws_;  // recorded graphs may still use them
};

}  // namespace nibble::cuda
