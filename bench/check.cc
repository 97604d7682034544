// The fp64 reference MoE for a few tokens, from downloaded expert weights.
#include "check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "cuda/cuda_check.h"

namespace nibble::bench {
namespace {

float bf16_bits_to_float(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof(f));
  return f;
}

std::vector<float> download_bf16_rows(const void* device, int64_t rows, int64_t width) {
  std::vector<uint16_t> raw(rows * width);
  cuda_check(cudaMemcpy(raw.data(), device, raw.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) out[i] = bf16_bits_to_float(raw[i]);
  return out;
}

// y (H) += weight · down · (silu(gate · x) ⊙ (up · x)), fp64 throughout.
void add_expert(const HostExpert& w, const float* x, double weight, int64_t hidden, int64_t inter,
                std::vector<double>& y) {
  std::vector<double> act(inter);
  for (int64_t j = 0; j < inter; ++j) {
    double gate = 0.0;
    double up = 0.0;
    const float* g_row = &w.gate_up[j * hidden];
    const float* u_row = &w.gate_up[(inter + j) * hidden];
    for (int64_t c = 0; c < hidden; ++c) {
      gate += static_cast<double>(g_row[c]) * x[c];
      up += static_cast<double>(u_row[c]) * x[c];
    }
    act[j] = gate / (1.0 + std::exp(-gate)) * up;
  }
  for (int64_t h = 0; h < hidden; ++h) {
    double sum = 0.0;
    const float* d_row = &w.down[h * inter];
    for (int64_t j = 0; j < inter; ++j) sum += static_cast<double>(d_row[j]) * act[j];
    y[h] += weight * sum;
  }
}

}  // namespace

std::optional<CheckResult> check_variant(MoeVariant& variant, const MoeShape& shape,
                                         const LayerInputs& inputs, int64_t num_check,
                                         cudaStream_t stream) {
  const int64_t tokens = std::min(num_check, inputs.num_tokens);
  std::vector<int64_t> checked;
  for (int64_t i = 0; i + 1 < tokens; ++i) checked.push_back(i);
  checked.push_back(inputs.num_tokens - 1);
  const int64_t hidden = shape.hidden_size;
  const Routing& routing = *inputs.routing;
  std::map<int64_t, HostExpert> experts;
  std::optional<HostExpert> first = variant.expert_weights(routing.topk_ids[0]);
  if (!first) return std::nullopt;
  experts.emplace(routing.topk_ids[0], std::move(*first));

  // Poison the output (0xFFFF is a BF16 NaN): every element must be written by the layer.
  const LayerLaunch launch = variant.prepare(inputs);
  cuda_check(cudaMemsetAsync(const_cast<void*>(variant.output()), 0xFF,
                             static_cast<std::size_t>(inputs.num_tokens * hidden) * 2, stream));
  launch(stream);
  cuda_check(cudaStreamSynchronize(stream));
  const std::vector<float> out = download_bf16_rows(variant.output(), inputs.num_tokens, hidden);
  const std::vector<float> x = download_bf16_rows(inputs.x, inputs.num_tokens, hidden);

  double err2 = 0.0;
  double ref2 = 0.0;
  for (const int64_t t : checked) {
    std::vector<double> ref(hidden, 0.0);
    for (int64_t k = 0; k < routing.top_k; ++k) {
      const int64_t e = routing.topk_ids[t * routing.top_k + k];
      if (!experts.contains(e)) experts.emplace(e, *variant.expert_weights(e));
      add_expert(experts.at(e), &x[t * hidden], routing.topk_weights[t * routing.top_k + k], hidden,
                 shape.intermediate_size, ref);
    }
    for (int64_t h = 0; h < hidden; ++h) {
      const double diff = out[t * hidden + h] - ref[h];
      err2 += diff * diff;
      ref2 += ref[h] * ref[h];
    }
  }
  // An unwritten (still poisoned) or non-finite element anywhere fails the check.
  const bool all_finite =
      std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); });
  return CheckResult{.relative_error = all_finite ? std::sqrt(err2 / ref2) : NAN,
                     .tolerance = variant.check_tolerance(),
                     .tokens = static_cast<int64_t>(checked.size())};
}

}  // namespace nibble::bench
