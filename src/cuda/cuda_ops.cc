// CudaOps: dispatch to the kernels, and the memory they share.
#include "cuda/cuda_ops.h"

#include <cmath>
#include <vector>

#include "cuda/basic_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"

namespace nibble::cuda {

CudaOps::CudaOps() {
  check(device_count() > 0, "--device cuda: no CUDA device is available");
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  check(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS, "cuBLAS initialization failed");
}

CudaOps::~CudaOps() {
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

Tensor CudaOps::empty(DType dtype, Shape shape) { return cuda::empty(dtype, std::move(shape)); }

Tensor CudaOps::upload(const Tensor& host) {
  cuda_check(cudaStreamSynchronize(stream_));
  return cuda::upload(host);
}

Tensor CudaOps::download(const Tensor& device_tensor) {
  cuda_check(cudaStreamSynchronize(stream_));
  return cuda::download(device_tensor);
}

MoeWeights CudaOps::prepare_moe(const MoeWeights& host) {
  check(host.experts.format == WeightFormat::kInt4, "--device cuda runs ",
        weight_format_name(host.experts.format), " experts not yet: use --quantization quark_int4fp8_moe");
  const MoeWeightsW4A8 w = upload_moe_w4a8(host);
  return {.router = w.router,
          .experts = {.format = WeightFormat::kInt4, .num_experts = w.num_experts, .hidden_size = w.hidden_size,
                      .intermediate_size = w.intermediate_size, .gate_up = w.gate_up, .gate_up_scale = w.gate_up_scale,
                      .down = w.down, .down_scale = w.down_scale}};
}

void CudaOps::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  cuda::embedding(ids, table, out, stream_);
}

void CudaOps::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  cuda::rms_norm(x, weight, eps, out, stream_);
}

void CudaOps::add(Tensor& x, const Tensor& y) { residual_add(x, y, stream_); }

void CudaOps::scale(Tensor& x, float factor) { cuda::scale(x, factor, stream_); }

void CudaOps::linear(const Tensor& x, const Linear& w, Tensor& out) {
  cuda::linear(x, w, out, cublas_, linear_ws_, stream_);
}

void CudaOps::logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) {
  Tensor gathered = empty(DType::kBF16, {rows.dim(0), x.dim(1)});
  gather_rows(x, rows, gathered, stream_);
  cuda::linear(gathered, w, out, cublas_, linear_ws_, stream_);
}

void CudaOps::rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) {
  auto& inv_freq = inv_freq_[{theta, params.head_dim}];
  if (!inv_freq.defined()) {  // the same fp32 values as the CPU twin computes
    const int64_t half = params.head_dim / 2;
    Tensor host = Tensor::zeros(DType::kF32, {half});
    for (int64_t i = 0; i < half; ++i)
      host.data<float>()[i] =
          static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(params.head_dim)));
    inv_freq = upload(host);
  }
  cuda::rope(qkv, positions, inv_freq, params, stream_);
}

void CudaOps::attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                        const AttentionParams& params, Tensor& out) {
  cuda::attention(qkv, cache, cache_dtype, batch, params, out, stream_);
}

void CudaOps::moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) {
  const MoeWeightsW4A8 weights{.num_experts = w.experts.num_experts, .hidden_size = w.experts.hidden_size,
                               .intermediate_size = w.experts.intermediate_size, .gate_up = w.experts.gate_up,
                               .gate_up_scale = w.experts.gate_up_scale, .down = w.experts.down,
                               .down_scale = w.experts.down_scale, .router = w.router};
  if (!moe_ws_ || moe_ws_->max_tokens < x.dim(0) || moe_ws_->top_k != params.top_k) {
    cuda_check(cudaStreamSynchronize(stream_));  // the old workspace may still be in use
    moe_ws_ = std::make_unique<MoeWorkspace>(weights, std::max<int64_t>(x.dim(0), 64), params.top_k);
  }
  moe_w4a8(x, weights, params, *moe_ws_, out, stream_);
}

}  // namespace nibble::cuda
