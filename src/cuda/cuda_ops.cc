// CudaOps: dispatch to the kernels, and the memory they share.
#include "cuda/cuda_ops.h"

#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "cuda/argmax.h"
#include "cuda/basic_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/logit_penalties.h"
#include "cuda/residual_norm_all_reduce.h"
#include "cuda/sampling.h"

namespace nibble::cuda {

CudaOps::CudaOps() {
  check(device_count() > 0, "--device cuda: no CUDA device is available");
  stream_ = compute_stream();
  check(cublasCreate(&cublas_) == CUBLAS_STATUS_SUCCESS, "cuBLAS initialization failed");
  cublas_workspace_ = empty(DType::kU8, {int64_t{32} << 20});
  check(cublasSetWorkspace(cublas_, cublas_workspace_.raw(), static_cast<std::size_t>(cublas_workspace_.nbytes())) ==
            CUBLAS_STATUS_SUCCESS,
        "cuBLAS workspace setup failed");
  check(cublasSetStream(cublas_, stream_) == CUBLAS_STATUS_SUCCESS, "cuBLAS stream setup failed");
  cublas_check(cublasLtCreate(&cublas_lt_));
  linear_ws_.lt = cublas_lt_;
}

CudaOps::~CudaOps() {
  if (cublas_) cublasDestroy(cublas_);
  if (cublas_lt_) cublasLtDestroy(cublas_lt_);
}

Tensor CudaOps::empty(DType dtype, Shape shape) { return cuda::empty(dtype, std::move(shape)); }

Tensor CudaOps::upload(const Tensor& host) { return cuda::upload(host); }

Tensor CudaOps::download(const Tensor& device_tensor) { return cuda::download(device_tensor); }

MemoryInfo CudaOps::memory_info() const {
  // Memory freed into the stream-ordered pool is held there, unseen by cudaMemGetInfo: give it back
  // first, so `free` counts it (outside any step: this synchronizes the device).
  int device = 0;
  cudaMemPool_t pool = nullptr;
  cuda_check(cudaDeviceSynchronize());
  cuda_check(cudaGetDevice(&device));
  cuda_check(cudaDeviceGetDefaultMemPool(&pool, device));
  cuda_check(cudaMemPoolTrimTo(pool, 0));
  std::size_t free = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free, &total));
  return {.free_bytes = static_cast<int64_t>(free), .total_bytes = static_cast<int64_t>(total)};
}

void CudaOps::copy_to_device(const Tensor& host, Tensor& dst) { cuda::copy_to_device(host, dst); }

namespace {

// A captured CUDA graph and the device memory its kernels use.
class CudaGraph final : public RecordedStep {
 public:
  CudaGraph(cudaGraphExec_t exec, std::vector<std::shared_ptr<void>> memory, cudaStream_t stream)
      : exec_(exec), memory_(std::move(memory)), stream_(stream) {}
  ~CudaGraph() override { (void)cudaGraphExecDestroy(exec_); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void replay() override { cuda_check(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  std::vector<std::shared_ptr<void>> memory_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<RecordedStep> CudaOps::record(const std::function<void()>& step) {
  cuda_check(cudaStreamSynchronize(stream_));
  GraphMemory memory;
  cudaGraph_t graph = nullptr;
  // Relaxed: allocations (cudaMalloc, kept by the graph) are allowed while capturing.
  cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  try {
    step();
  } catch (...) {
    (void)cudaStreamEndCapture(stream_, &graph);
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  cuda_check(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  cuda_check(status);
  return std::make_unique<CudaGraph>(exec, memory.release(), stream_);
}

MoeWeights CudaOps::prepare_moe(const MoeWeights& host) {
  if (host.experts.format == WeightFormat::kBf16) return Ops::prepare_moe(host);  // as stored
  const MoeWeightsW4A8 w = upload_moe_w4a8(host);
  return {.router = w.router,
          .experts = {.format = host.experts.format, .num_experts = w.num_experts, .hidden_size = w.hidden_size,
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

void CudaOps::add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  cuda::add_rms_norm(x, y, weight, eps, out, stream_);
}

void CudaOps::all_reduce_add_rms_norm(Communicator& group, Tensor& y, Tensor& x, const Tensor* post_weight,
                                      const Tensor& weight, float eps, Tensor& out) {
  enum class Fused { kNone, kPlain, kAll };  // kPlain: only without a post-norm
  static const Fused fused = [] {
    const std::string name = env_choice("NIBBLE_TP_FUSED_NORM", {"0", "1", "all"});
    return name == "0" ? Fused::kNone : name == "all" ? Fused::kAll : Fused::kPlain;
  }();
  auto* fusing = dynamic_cast<ResidualNormAllReduce*>(&group);
  const bool wanted = fused == Fused::kAll || (fused == Fused::kPlain && post_weight == nullptr);
  if (wanted && fusing != nullptr && fusing->all_reduce_add_rms_norm(y, x, post_weight, weight, eps, out)) return;
  Ops::all_reduce_add_rms_norm(group, y, x, post_weight, weight, eps, out);
}

void CudaOps::scale(Tensor& x, float factor) { cuda::scale(x, factor, stream_); }

void CudaOps::argmax(const Tensor& x, Tensor& out) { argmax_rows(x, out, stream_); }

void CudaOps::sample(const Tensor& logits, const SampleSettings& settings, Tensor& out) {
  static const bool on_device = env_choice("NIBBLE_DEVICE_SAMPLING", {"0", "1"}) != "0";
  const bool filtered = settings.top_k.defined() || settings.top_p.defined();
  if (on_device && !filtered) return sample_rows(logits, settings.temperatures, settings.keys, out, stream_);
  if (on_device)
    return sample_filtered_rows(logits, settings.temperatures, settings.keys,
                                settings.top_k.defined() ? &settings.top_k : nullptr,
                                settings.top_p.defined() ? &settings.top_p : nullptr, out, stream_);
  const auto host = [&](const Tensor& t) { return t.defined() ? download(t) : Tensor(); };
  Tensor ids = Tensor::zeros(DType::kI32, {logits.dim(0)});
  Ops::sample(download(logits),
              {.temperatures = host(settings.temperatures),
               .keys = host(settings.keys),
               .top_k = host(settings.top_k),
               .top_p = host(settings.top_p)},
              ids);
  copy_to_device(ids, out);
}

void CudaOps::penalize(Tensor& logits, const PenaltySettings& settings) { penalize_rows(logits, settings, stream_); }

void CudaOps::linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group) {
  const PlainLaunches plain(plain_site("linear"));
  cuda::linear(x, w, out, cublas_, linear_ws_, stream_, row_group);
}

void CudaOps::logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) {
  Tensor gathered = empty(DType::kBF16, {rows.dim(0), x.dim(1)});
  gather_rows(x, rows, gathered, stream_);
  cuda::linear(gathered, w, out, cublas_, linear_ws_, stream_);
}

const Tensor& CudaOps::inv_freq(double theta, int64_t head_dim) {
  auto& inv_freq = inv_freq_[{theta, head_dim}];
  if (!inv_freq.defined()) {  // the same fp32 values as the CPU twin computes
    const int64_t half = head_dim / 2;
    Tensor host = Tensor::zeros(DType::kF32, {half});
    for (int64_t i = 0; i < half; ++i)
      host.data<float>()[i] =
          static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
    inv_freq = upload(host);
  }
  return inv_freq;
}

void CudaOps::rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) {
  cuda::rope(qkv, positions, inv_freq(theta, params.head_dim), params, stream_);
}

void CudaOps::rope_attention(Tensor& qkv, double theta, KvCacheLayer& cache, KvCacheDType cache_dtype,
                             const ForwardBatch& batch, const AttentionParams& params, Tensor& out) {
  const PlainLaunches plain(plain_site("attention"));
  cuda::rope_attention(qkv, inv_freq(theta, params.head_dim), cache, cache_dtype, batch, params, out, stream_);
}

void CudaOps::attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype, const ForwardBatch& batch,
                        const AttentionParams& params, Tensor& out) {
  const PlainLaunches plain(plain_site("attention"));
  cuda::attention(qkv, cache, cache_dtype, batch, params, out, stream_);
}

void CudaOps::moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) {
  const PlainLaunches plain(plain_site("moe"));
  if (w.experts.format == WeightFormat::kBf16) return moe_bf16(x, w, params, moe_bf16_ws_, out, cublas_, stream_);
  const MoeWeightsW4A8 weights{.format = w.experts.format == WeightFormat::kFp8 ? ExpertWeightFormat::kFp8
                                                                                : ExpertWeightFormat::kInt4,
                               .num_experts = w.experts.num_experts, .hidden_size = w.experts.hidden_size,
                               .intermediate_size = w.experts.intermediate_size, .gate_up = w.experts.gate_up,
                               .gate_up_scale = w.experts.gate_up_scale, .down = w.experts.down,
                               .down_scale = w.experts.down_scale, .router = w.router};
  if (!moe_ws_ || moe_ws_->max_tokens < x.dim(0) || moe_ws_->top_k != params.top_k) {
    if (moe_ws_) {
      // Recorded graphs may still read the decode buffers; the prefill buffers (gigabytes at large
      // token counts) never run inside a graph, so they go now.
      moe_ws_->prefill.reset();
      retired_moe_ws_.push_back(std::move(moe_ws_));
    }
    moe_ws_ = std::make_unique<MoeWorkspace>(weights, std::max<int64_t>(x.dim(0), 64), params.top_k);
  }
  moe_w4a8(x, weights, params, *moe_ws_, out, stream_);
}

}  // namespace nibble::cuda
