// CpuOps: the MoE layer. Router in fp32 over BF16 weights, optional logit soft-cap, softmax, top-k
// (ties to the lower expert index), optional renormalization; then per expert its tokens go through
// gate_up, activation · up and down (each a CPU GEMM twin), and are summed back in token order
// weighted by their routing weight.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "cpu/cpu_ops.h"
#include "core/fp8.h"
#include "cpu/gemm.h"
#include "model/communicator.h"
#include "quant/fp8_quant.h"

namespace nibble {
namespace {

WeightView expert_view(const Tensor& stacked, const Tensor& scale, WeightFormat format, int64_t e,
                       int64_t rows, int64_t cols) {
  const Tensor slice = stacked[e];
  return {.format = format,
          .rows = rows,
          .cols = cols,
          .data = slice.raw(),
          .scale = format == WeightFormat::kBf16 ? nullptr : scale.data<float>() + e * rows,
          .input_scale = 0.0f};
}

float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: return x / (1.0f + std::exp(-x));
    case Activation::kGelu: return 0.5f * x * (1.0f + std::erf(x / std::sqrt(2.0f)));
    case Activation::kGeluTanh: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    }
  }
  return x;
}

}  // namespace

void CpuOps::moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) {
  const Experts& ex = w.experts;
  const int64_t T = x.dim(0), H = ex.hidden_size, I = ex.intermediate_size, E = ex.num_experts;
  const int64_t K = params.top_k;
  expect(x, DType::kF32, {-1, H}, "moe input");
  expect(out, DType::kF32, {T, H}, "moe output");
  check(K >= 1 && K <= E, "moe: top_k ", K, " with ", E, " experts");

  // Routing.
  std::vector<float> router_logits(T * E);
  gemm(x.data<float>(), T, {.format = WeightFormat::kBf16, .rows = E, .cols = H, .data = w.router.raw()},
       router_logits.data());
  std::vector<std::vector<std::pair<int64_t, float>>> tokens_of(E);  // expert -> (token, weight)
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    float* logit = &router_logits[t * E];
    if (params.router_softcap > 0.0f)
      for (int64_t e = 0; e < E; ++e) logit[e] = params.router_softcap * std::tanh(logit[e] / params.router_softcap);
    const float max_logit = *std::max_element(logit, logit + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += logit[e] = std::exp(logit[e] - max_logit);
    for (int64_t e = 0; e < E; ++e) logit[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
    float top_sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) top_sum += logit[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      const float weight = params.router_norm == RouterNorm::kRenormalize ? logit[order[k]] / top_sum
                                                                          : logit[order[k]];
      tokens_of[order[k]].push_back({t, weight});
    }
  }

  // Experts, each over its gathered tokens: gate_up and activation · up for every expert, then the
  // down projections. Under tensor parallelism with FP8 inputs (quantized experts) each rank holds a
  // slice of a row's intermediate values, so its FP8 scale comes from the row's amax over all ranks:
  // the same codes and scale as on one rank.
  std::fill_n(out.data<float>(), T * H, 0.0f);
  std::vector<std::vector<float>> acts(E);  // expert -> (routed rows, I)
  int64_t routed_rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    const auto& routed = tokens_of[e];
    const auto n = static_cast<int64_t>(routed.size());
    if (n == 0) continue;
    std::vector<float> xs(n * H), gate_up(n * 2 * I);
    std::vector<float>& act = acts[e];
    act.resize(n * I);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x.data<float>() + routed[r].first * H, H, &xs[r * H]);
    gemm(xs.data(), n, expert_view(ex.gate_up, ex.gate_up_scale, ex.format, e, 2 * I, H), gate_up.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < I; ++i)
        act[r * I + i] = activate(params.activation, gate_up[r * 2 * I + i]) * gate_up[r * 2 * I + I + i];
    routed_rows += n;
  }
  const bool shared_amax = params.communicator != nullptr && ex.format != WeightFormat::kBf16 && routed_rows > 0;
  Tensor amax;  // F32 (routed rows) in expert order: the rows' amax over all ranks
  if (shared_amax) {
    amax = Tensor::zeros(DType::kF32, {routed_rows});
    float* a = amax.data<float>();
    for (int64_t e = 0; e < E; ++e)
      for (std::size_t r = 0; r < tokens_of[e].size(); ++r, ++a)
        for (int64_t i = 0; i < I; ++i) *a = std::max(*a, std::fabs(acts[e][r * I + i]));
    params.communicator->all_reduce_max(amax);  // every rank routes alike: the same rows in the same order
  }
  int64_t row = 0;
  for (int64_t e = 0; e < E; ++e) {
    const auto& routed = tokens_of[e];
    const auto n = static_cast<int64_t>(routed.size());
    if (n == 0) continue;
    std::vector<float> down(n * H);
    const WeightView w2 = expert_view(ex.down, ex.down_scale, ex.format, e, H, I);
    if (shared_amax) {
      for (int64_t r = 0; r < n; ++r) {  // each row with its scale, as the one-rank quantizer computes it
        WeightView w2_row = w2;
        w2_row.input_scale = std::max(amax.data<float>()[row + r], kMinActivationAmax) / kFp8E4M3Max;
        gemm(&acts[e][r * I], 1, w2_row, &down[r * H]);
      }
    } else {
      gemm(acts[e].data(), n, w2, down.data());
    }
    row += n;
    for (int64_t r = 0; r < n; ++r) {
      float* o = out.data<float>() + routed[r].first * H;
      for (int64_t h = 0; h < H; ++h) o[h] += routed[r].second * down[r * H + h];
    }
  }
}

}  // namespace nibble
