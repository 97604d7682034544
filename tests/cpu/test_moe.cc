// CPU MoE layer: each expert activation against its formula, and the routing weights (soft-capped
// or not, renormalized or not) read back through experts built to echo them.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"

namespace nibble {
namespace {

// BF16 stacked expert weights (E, rows, cols), zero but for the entries `set` writes.
Tensor bf16_zeros(Shape shape) {
  return Tensor::zeros(DType::kBF16, std::move(shape));
}

void set(Tensor& t, int64_t index, float value) {
  t.data<Bf16>()[index] = float_to_bf16(value);
}

MoeWeights bf16_moe(Tensor router, Tensor gate_up, Tensor down) {
  const int64_t E = gate_up.dim(0), H = gate_up.dim(2), I = gate_up.dim(1) / 2;
  return {.router = std::move(router),
          .experts = {.format = WeightFormat::kBf16,
                      .num_experts = E,
                      .hidden_size = H,
                      .intermediate_size = I,
                      .gate_up = std::move(gate_up),
                      .gate_up_scale = {},
                      .down = std::move(down),
                      .down_scale = {}}};
}

double reference_activation(Activation act, double x) {
  switch (act) {
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kGeluTanh:
      return 0.5 * x *
             (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
  }
  return 0;
}

// One expert that echoes act(x[i]) · x[8] into out[i], for i < 8.
TEST(CpuMoe, Activations) {
  constexpr int64_t H = 9, I = 8;
  Tensor gate_up = bf16_zeros({1, 2 * I, H}), down = bf16_zeros({1, H, I});
  for (int64_t i = 0; i < I; ++i) {
    set(gate_up, i * H + i, 1.0f);        // gate_i = x_i
    set(gate_up, (I + i) * H + 8, 1.0f);  // up_i = x_8
    set(down, i * I + i, 1.0f);           // out_i = act(gate_i) · up_i
  }
  const MoeWeights w = bf16_moe(bf16_zeros({1, H}), gate_up, down);
  const float xs[H] = {-3.0f, -1.0f, -0.5f, 0.0f, 0.25f, 1.0f, 2.0f, 4.0f, 1.0f};
  Tensor x = Tensor::zeros(DType::kF32, {1, H});
  std::copy_n(xs, H, x.data<float>());
  CpuOps ops;
  for (const Activation act : {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh}) {
    Tensor out = Tensor::zeros(DType::kF32, {1, H});
    ops.moe(x, w, {.top_k = 1, .router_norm = RouterNorm::kNone, .activation = act}, out);
    for (int64_t i = 0; i < I; ++i)
      EXPECT_NEAR(out.data<float>()[i], reference_activation(act, xs[i]), 1e-6)
          << "activation " << static_cast<int>(act) << " at x = " << xs[i];
  }
  // The two GELUs at 1, from the literature: they differ in the fourth decimal.
  Tensor out = Tensor::zeros(DType::kF32, {1, H});
  ops.moe(x, w, {.top_k = 1, .router_norm = RouterNorm::kNone, .activation = Activation::kGeluTanh},
          out);
  EXPECT_NEAR(out.data<float>()[5], 0.8411920, 1e-6);
  ops.moe(x, w, {.top_k = 1, .router_norm = RouterNorm::kNone, .activation = Activation::kGelu},
          out);
  EXPECT_NEAR(out.data<float>()[5], 0.8413447, 1e-6);
}

// Four experts; expert e writes silu(1) × its routing weight into out[e + 1]. For x = (1, 0, ...)
// the router logits are the router's first column.
TEST(CpuMoe, RoutingWeights) {
  constexpr int64_t E = 4, H = 8, I = 8;
  const float logits[E] = {2.0f, 40.0f, 39.0f, -3.0f};
  Tensor router = bf16_zeros({E, H}), gate_up = bf16_zeros({E, 2 * I, H}),
         down = bf16_zeros({E, H, I});
  for (int64_t e = 0; e < E; ++e) {
    set(router, e * H, logits[e]);
    set(gate_up, e * 2 * I * H, 1.0f);         // gate_0 = x_0
    set(gate_up, (e * 2 * I + I) * H, 1.0f);   // up_0 = x_0
    set(down, e * H * I + (e + 1) * I, 1.0f);  // out_{e+1} = act(gate_0) · up_0
  }
  const MoeWeights w = bf16_moe(router, gate_up, down);
  Tensor x = Tensor::zeros(DType::kF32, {1, H});
  x.data<float>()[0] = 1.0f;
  const double silu1 = reference_activation(Activation::kSilu, 1.0);
  CpuOps ops;
  for (const float cap : {0.0f, 30.0f}) {
    for (const RouterNorm norm : {RouterNorm::kNone, RouterNorm::kRenormalize}) {
      std::vector<double> p(E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e)
        sum += p[e] = std::exp(cap > 0 ? cap * std::tanh(logits[e] / cap) : logits[e]);
      for (double& v : p) v /= sum;
      const double chosen = p[1] + p[2];  // experts 1 and 2 lead
      Tensor out = Tensor::zeros(DType::kF32, {1, H});
      ops.moe(
          x, w,
          {.top_k = 2, .router_norm = norm, .activation = Activation::kSilu, .router_softcap = cap},
          out);
      const double scale = norm == RouterNorm::kRenormalize ? 1 / chosen : 1;
      SCOPED_TRACE(testing::Message()
                   << "cap " << cap << ", renormalize " << (norm == RouterNorm::kRenormalize));
      EXPECT_EQ(out.data<float>()[1], 0.0f);
      EXPECT_NEAR(out.data<float>()[2], silu1 * p[1] * scale, 1e-6);
      EXPECT_NEAR(out.data<float>()[3], silu1 * p[2] * scale, 1e-6);
      EXPECT_EQ(out.data<float>()[4], 0.0f);
    }
  }
}

}  // namespace
}  // namespace nibble
