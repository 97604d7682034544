// BF16 MoE baseline through cuBLAS: per-expert cublasGemmEx calls, or one grouped call per GEMM.
// Weights (E, 2I, H) and (E, H, I) BF16 row-major, activations BF16 between the steps, fp32
// accumulation in the GEMMs and the combine.
#include <string>

#include "baseline_util.h"
#include "baselines.h"
#include "device_buffer.h"
#include "handles.h"
#include "random_fill.h"

namespace nibble::bench {
namespace {

constexpr std::size_t kBlasWorkspaceBytes = std::size_t{32} << 20;
constexpr std::size_t kBf16 = 2;

// Arguments of one cublasGemmGroupedBatchedEx call: one group of one problem per active expert.
// D (n, m) row-major = X (n, k) · W (m, k)ᵀ for every expert, as in gemm_bf16 below.
struct GroupedGemm {
  std::vector<cublasOperation_t> transa, transb;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;
  DeviceBuffer weights, inputs, outputs;  // device arrays of device pointers

  GroupedGemm(const std::vector<ExpertRows>& experts, int64_t m_out, int64_t k_in,
              const char* weight_base, const char* input_base, char* output_base) {
    std::vector<const void*> w, x;
    std::vector<void*> y;
    for (const ExpertRows& e : experts) {
      transa.push_back(CUBLAS_OP_T);
      transb.push_back(CUBLAS_OP_N);
      m.push_back(static_cast<int>(m_out));
      n.push_back(static_cast<int>(e.num_rows));
      k.push_back(static_cast<int>(k_in));
      lda.push_back(static_cast<int>(k_in));
      ldb.push_back(static_cast<int>(k_in));
      ldc.push_back(static_cast<int>(m_out));
      group_size.push_back(1);
      alpha.push_back(1.0f);
      beta.push_back(0.0f);
      w.push_back(weight_base + e.expert * m_out * k_in * kBf16);
      x.push_back(input_base + e.first_row * k_in * kBf16);
      y.push_back(output_base + e.first_row * m_out * kBf16);
    }
    weights = upload_vector(w);
    inputs = upload_vector(x);
    outputs = upload_vector(y);
  }

  void run(cublasHandle_t handle) const {
    cublas_check(cublasGemmGroupedBatchedEx(
        handle, transa.data(), transb.data(), m.data(), n.data(), k.data(), alpha.data(),
        weights.as<const void* const>(), CUDA_R_16BF, lda.data(), inputs.as<const void* const>(),
        CUDA_R_16BF, ldb.data(), beta.data(), outputs.as<void* const>(), CUDA_R_16BF, ldc.data(),
        static_cast<int>(group_size.size()), group_size.data(), CUBLAS_COMPUTE_32F));
  }
};

// y (n, m) row-major = x (n, k) · w (m, k)ᵀ, BF16 in and out.
void gemm_bf16(cublasHandle_t handle, int64_t m, int64_t n, int64_t k, const void* w, const void* x,
               void* y) {
  const float one = 1.0f;
  const float zero = 0.0f;
  cublas_check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(m),
                            static_cast<int>(n), static_cast<int>(k), &one, w, CUDA_R_16BF,
                            static_cast<int>(k), x, CUDA_R_16BF, static_cast<int>(k), &zero, y,
                            CUDA_R_16BF, static_cast<int>(m), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

class Bf16Moe final : public MoeVariant {
 public:
  Bf16Moe(const MoeShape& shape, int64_t max_tokens, GemmGrouping grouping, uint64_t seed)
      : s_(shape),
        grouping_(grouping),
        gate_up_(elements(shape.num_experts, 2 * shape.intermediate_size, shape.hidden_size) *
                 kBf16),
        down_(elements(shape.num_experts, shape.hidden_size, shape.intermediate_size) * kBf16),
        xs_(elements(max_tokens, shape.top_k, shape.hidden_size) * kBf16),
        gate_up_out_(elements(max_tokens, shape.top_k, 2 * shape.intermediate_size) * kBf16),
        act_(elements(max_tokens, shape.top_k, shape.intermediate_size) * kBf16),
        down_out_(elements(max_tokens, shape.top_k, shape.hidden_size) * kBf16),
        out_(elements(max_tokens, 1, shape.hidden_size) * kBf16),
        blas_workspace_(kBlasWorkspaceBytes) {
    fill_uniform_bf16(gate_up_.get(), gate_up_.bytes() / kBf16, weight_amplitude(s_.hidden_size),
                      seed + 1, nullptr);
    fill_uniform_bf16(down_.get(), down_.bytes() / kBf16, weight_amplitude(s_.intermediate_size),
                      seed + 2, nullptr);
    cuda_check(cudaDeviceSynchronize());
    cublas_check(cublasSetWorkspace(blas_.get(), blas_workspace_.get(), blas_workspace_.bytes()));
  }

  std::string name() const override {
    return grouping_ == GemmGrouping::kPerExpert ? "bf16-cublas" : "bf16-grouped";
  }

  double weight_bytes(int64_t active_experts) const override {
    return static_cast<double>(active_experts) * 3.0 *
           static_cast<double>(s_.hidden_size * s_.intermediate_size) * kBf16;
  }

  LayerLaunch prepare(const LayerInputs& in) override {
    experts_ = active_expert_rows(*in.routing);
    const int64_t two_i = 2 * s_.intermediate_size;
    grouped_gate_up_.reset();
    grouped_down_.reset();
    if (grouping_ == GemmGrouping::kGrouped) {
      grouped_gate_up_ =
          std::make_unique<GroupedGemm>(experts_, two_i, s_.hidden_size, gate_up_.as<char>(),
                                        xs_.as<char>(), gate_up_out_.as<char>());
      grouped_down_ =
          std::make_unique<GroupedGemm>(experts_, s_.hidden_size, s_.intermediate_size,
                                        down_.as<char>(), act_.as<char>(), down_out_.as<char>());
    }
    return [this, in](cudaStream_t stream) { enqueue(in, stream); };
  }

  const void* output() const override { return out_.get(); }

  std::optional<HostExpert> expert_weights(int64_t e) const override {
    const int64_t per_gate_up = 2 * s_.intermediate_size * s_.hidden_size;
    const int64_t per_down = s_.hidden_size * s_.intermediate_size;
    return HostExpert{.gate_up = download_as_f32(gate_up_.as<char>() + e * per_gate_up * kBf16,
                                                 ElementType::kBf16, per_gate_up, 1.0f),
                      .down = download_as_f32(down_.as<char>() + e * per_down * kBf16,
                                              ElementType::kBf16, per_down, 1.0f)};
  }

 private:
  static std::size_t elements(int64_t a, int64_t b, int64_t c) {
    return static_cast<std::size_t>(a * b * c);
  }

  void enqueue(const LayerInputs& in, cudaStream_t stream) {
    const int64_t hidden = s_.hidden_size;
    const int64_t inter = s_.intermediate_size;
    const int64_t rows = in.routing->num_rows();
    const DeviceRouting& r = *in.device_routing;
    cublas_check(cublasSetStream(blas_.get(), stream));
    gather_rows(in.x, r.sorted_pairs.as<int32_t>(), s_.top_k, rows, hidden, xs_.get(), stream);
    if (grouped_gate_up_) {
      grouped_gate_up_->run(blas_.get());
    } else {
      for (const ExpertRows& e : experts_)
        gemm_bf16(blas_.get(), 2 * inter, e.num_rows, hidden,
                  gate_up_.as<char>() + e.expert * 2 * inter * hidden * kBf16,
                  xs_.as<char>() + e.first_row * hidden * kBf16,
                  gate_up_out_.as<char>() + e.first_row * 2 * inter * kBf16);
    }
    silu_mul(gate_up_out_.get(), rows, inter, act_.get(), stream);
    if (grouped_down_) {
      grouped_down_->run(blas_.get());
    } else {
      for (const ExpertRows& e : experts_)
        gemm_bf16(blas_.get(), hidden, e.num_rows, inter,
                  down_.as<char>() + e.expert * hidden * inter * kBf16,
                  act_.as<char>() + e.first_row * inter * kBf16,
                  down_out_.as<char>() + e.first_row * hidden * kBf16);
    }
    combine(down_out_.get(), r.pair_rows.as<int32_t>(), r.topk_weights.as<float>(), nullptr,
            in.num_tokens, s_.top_k, hidden, out_.get(), stream);
  }

  MoeShape s_;
  GemmGrouping grouping_;
  BlasHandle blas_;
  DeviceBuffer gate_up_;      // BF16 (E, 2I, H)
  DeviceBuffer down_;         // BF16 (E, H, I)
  DeviceBuffer xs_;           // BF16 (T·K, H), sorted rows
  DeviceBuffer gate_up_out_;  // BF16 (T·K, 2I)
  DeviceBuffer act_;          // BF16 (T·K, I)
  DeviceBuffer down_out_;     // BF16 (T·K, H)
  DeviceBuffer out_;          // BF16 (T, H)
  DeviceBuffer blas_workspace_;
  std::vector<ExpertRows> experts_;  // of the prepared token count
  std::unique_ptr<GroupedGemm> grouped_gate_up_, grouped_down_;
};

}  // namespace

std::unique_ptr<MoeVariant> make_bf16_moe(const MoeShape& shape, int64_t max_tokens,
                                          GemmGrouping grouping, uint64_t seed) {
  return std::make_unique<Bf16Moe>(shape, max_tokens, grouping, seed);
}

}  // namespace nibble::bench
