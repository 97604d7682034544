// FP8 W8A8 MoE baseline through cuBLASLt, one GEMM per active expert (cuBLASLt 13.0 offers no
// grouped FP8 GEMM). Weights (E, 2I, H) and (E, H, I) F8_E4M3 with one fp32 scale per expert and
// matrix, applied by the GEMM as its alpha; activations quantized per token (row), their scales
// applied by our SiLU and combine kernels (a row scale commutes out of the GEMM).
#include <array>
#include <map>
#include <random>
#include <string>

#include "baseline_util.h"
#include "baselines.h"
#include "device_buffer.h"
#include "handles.h"
#include "cuda/lt_fp8_gemm.h"
#include "random_fill.h"

namespace nibble::bench {
namespace {

constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;
constexpr std::size_t kBf16 = 2;
constexpr float kFp8Max = 448.0f;

// Per-expert scales: the BF16 baseline's amplitude spread over the FP8 range, varied per expert.
std::vector<float> random_scales(int64_t experts, int64_t fan_in, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> spread(0.5f, 1.5f);
  std::vector<float> scales(experts);
  for (float& s : scales) s = weight_amplitude(fan_in) / kFp8Max * spread(rng);
  return scales;
}

class Fp8Moe final : public MoeVariant {
 public:
  Fp8Moe(const MoeShape& shape, int64_t max_tokens, uint64_t seed)
      : s_(shape),
        gate_up_(elements(shape.num_experts, 2 * shape.intermediate_size, shape.hidden_size)),
        down_(elements(shape.num_experts, shape.hidden_size, shape.intermediate_size)),
        gate_up_scales_(random_scales(shape.num_experts, shape.hidden_size, seed + 3)),
        down_scales_(random_scales(shape.num_experts, shape.intermediate_size, seed + 4)),
        xs_(elements(max_tokens, shape.top_k, shape.hidden_size)),
        x_scale_(elements(max_tokens, shape.top_k, 1) * sizeof(float)),
        gate_up_out_(elements(max_tokens, shape.top_k, 2 * shape.intermediate_size) * kBf16),
        act_(elements(max_tokens, shape.top_k, shape.intermediate_size)),
        act_scale_(elements(max_tokens, shape.top_k, 1) * sizeof(float)),
        down_out_(elements(max_tokens, shape.top_k, shape.hidden_size) * kBf16),
        out_(elements(max_tokens, 1, shape.hidden_size) * kBf16),
        lt_workspace_(kLtWorkspaceBytes) {
    fill_uniform_fp8(gate_up_.get(), gate_up_.bytes(), kFp8Max, seed + 1, nullptr);
    fill_uniform_fp8(down_.get(), down_.bytes(), kFp8Max, seed + 2, nullptr);
    cuda_check(cudaDeviceSynchronize());
  }

  std::string name() const override { return "fp8-cublaslt"; }

  double weight_bytes(int64_t active_experts) const override {
    return static_cast<double>(active_experts) * 3.0 *
           static_cast<double>(s_.hidden_size * s_.intermediate_size);
  }

  LayerLaunch prepare(const LayerInputs& in) override {
    experts_.clear();
    for (const ExpertRows& e : active_expert_rows(*in.routing))
      experts_.push_back({.rows = e,
                          .gate_up = &plan(2 * s_.intermediate_size, e.num_rows, s_.hidden_size),
                          .down = &plan(s_.hidden_size, e.num_rows, s_.intermediate_size)});
    return [this, in](cudaStream_t stream) { enqueue(in, stream); };
  }

  const void* output() const override { return out_.get(); }

  std::optional<HostExpert> expert_weights(int64_t e) const override {
    const int64_t per_gate_up = 2 * s_.intermediate_size * s_.hidden_size;
    const int64_t per_down = s_.hidden_size * s_.intermediate_size;
    return HostExpert{
        .gate_up = download_as_f32(gate_up_.as<char>() + e * per_gate_up, ElementType::kFp8E4M3,
                                   per_gate_up, gate_up_scales_[e]),
        .down = download_as_f32(down_.as<char>() + e * per_down, ElementType::kFp8E4M3, per_down,
                                down_scales_[e])};
  }

  // Two per-token FP8 roundings (x and the activation) on top of the FP8 weights the reference
  // uses.
  double check_tolerance() const override { return 8e-2; }

 private:
  struct ExpertStep {
    ExpertRows rows;
    cuda::LtFp8Gemm* gate_up = nullptr;
    cuda::LtFp8Gemm* down = nullptr;
  };

  static std::size_t elements(int64_t a, int64_t b, int64_t c) {
    return static_cast<std::size_t>(a * b * c);
  }

  cuda::LtFp8Gemm& plan(int64_t m, int64_t n, int64_t k) {
    std::unique_ptr<cuda::LtFp8Gemm>& p = plans_[{m, n, k}];
    if (!p) p = std::make_unique<cuda::LtFp8Gemm>(lt_.get(), m, n, k, kLtWorkspaceBytes);
    return *p;
  }

  void enqueue(const LayerInputs& in, cudaStream_t stream) {
    const int64_t hidden = s_.hidden_size;
    const int64_t inter = s_.intermediate_size;
    const int64_t rows = in.routing->num_rows();
    const DeviceRouting& r = *in.device_routing;
    void* ws = lt_workspace_.get();
    gather_quantize_fp8(in.x, r.sorted_pairs.as<int32_t>(), s_.top_k, rows, hidden, xs_.get(),
                        x_scale_.as<float>(), stream);
    for (const ExpertStep& step : experts_) {
      const ExpertRows& e = step.rows;
      step.gate_up->run(gate_up_.as<char>() + e.expert * 2 * inter * hidden,
                        xs_.as<char>() + e.first_row * hidden,
                        gate_up_out_.as<char>() + e.first_row * 2 * inter * kBf16,
                        gate_up_scales_[e.expert], ws, stream);
    }
    silu_mul_quantize_fp8(gate_up_out_.get(), x_scale_.as<float>(), rows, inter, act_.get(),
                          act_scale_.as<float>(), stream);
    for (const ExpertStep& step : experts_) {
      const ExpertRows& e = step.rows;
      step.down->run(
          down_.as<char>() + e.expert * hidden * inter, act_.as<char>() + e.first_row * inter,
          down_out_.as<char>() + e.first_row * hidden * kBf16, down_scales_[e.expert], ws, stream);
    }
    combine(down_out_.get(), r.pair_rows.as<int32_t>(), r.topk_weights.as<float>(),
            act_scale_.as<float>(), in.num_tokens, s_.top_k, hidden, out_.get(), stream);
  }

  MoeShape s_;
  LtHandle lt_;
  DeviceBuffer gate_up_;               // F8_E4M3 (E, 2I, H)
  DeviceBuffer down_;                  // F8_E4M3 (E, H, I)
  std::vector<float> gate_up_scales_;  // (E), the GEMMs' alpha
  std::vector<float> down_scales_;     // (E)
  DeviceBuffer xs_;                    // F8_E4M3 (T·K, H), sorted rows
  DeviceBuffer x_scale_;               // F32 (T·K)
  DeviceBuffer gate_up_out_;           // BF16 (T·K, 2I), without the row's x scale
  DeviceBuffer act_;                   // F8_E4M3 (T·K, I)
  DeviceBuffer act_scale_;             // F32 (T·K)
  DeviceBuffer down_out_;              // BF16 (T·K, H), without the row's act scale
  DeviceBuffer out_;                   // BF16 (T, H)
  DeviceBuffer lt_workspace_;
  std::map<std::array<int64_t, 3>, std::unique_ptr<cuda::LtFp8Gemm>> plans_;  // by (m, n, k)
  std::vector<ExpertStep> experts_;  // of the prepared token count
};

}  // namespace

std::unique_ptr<MoeVariant> make_fp8_moe(const MoeShape& shape, int64_t max_tokens, uint64_t seed) {
  return std::make_unique<Fp8Moe>(shape, max_tokens, seed);
}

}  // namespace nibble::bench
