// Default implementations of the Ops interface.
#include "model/ops.h"

#include <algorithm>
#include <cstring>

#include "core/logit_penalties.h"
#include "core/sampling_filter.h"
#include "model/communicator.h"

namespace nibble {

MoeWeights Ops::prepare_moe(const MoeWeights& host) {
  auto up = [this](const Tensor& t) { return t.defined() ? upload(t) : Tensor(); };
  MoeWeights w = host;
  w.router = up(host.router);
  w.experts.gate_up = up(host.experts.gate_up);
  w.experts.gate_up_scale = up(host.experts.gate_up_scale);
  w.experts.down = up(host.experts.down);
  w.experts.down_scale = up(host.experts.down_scale);
  return w;
}

void Ops::copy_to_device(const Tensor& host, Tensor& dst) {
  // The host-memory default (CPU backend): a plain copy.
  check(host.device() == Device::kCpu && dst.device() == Device::kCpu && host.dtype() == dst.dtype() &&
            host.numel() == dst.numel(),
        "copy_to_device: ", host.describe(), " does not fit ", dst.describe());
  std::memcpy(dst.raw(), host.raw(), static_cast<std::size_t>(host.nbytes()));
}

void Ops::argmax(const Tensor& x, Tensor& out) {
  check(x.device() == Device::kCpu && out.device() == Device::kCpu, "argmax: host tensors expected");
  expect(x, DType::kF32, {-1, -1}, "argmax input");
  expect(out, DType::kI32, {x.dim(0)}, "argmax output");
  const int64_t V = x.dim(1);
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const float* row = x.data<float>() + r * V;
    out.data<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
}

void Ops::sample(const Tensor& logits, const SampleSettings& settings, Tensor& out) {
  const auto on_host = [](const Tensor& t) { return !t.defined() || t.device() == Device::kCpu; };
  check(on_host(logits) && on_host(settings.temperatures) && on_host(settings.keys) && on_host(settings.top_k) &&
            on_host(settings.top_p) && on_host(out),
        "sample: host tensors expected");
  expect(logits, DType::kF32, {-1, -1}, "sample logits");
  const int64_t R = logits.dim(0), V = logits.dim(1);
  expect(settings.temperatures, DType::kF32, {R}, "sample temperatures");
  expect(settings.keys, DType::kI64, {R}, "sample keys");
  if (settings.top_k.defined()) expect(settings.top_k, DType::kI32, {R}, "sample top_k");
  if (settings.top_p.defined()) expect(settings.top_p, DType::kF32, {R}, "sample top_p");
  expect(out, DType::kI32, {R}, "sample output");
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.data<float>() + r * V;
    const float t = settings.temperatures.data<float>()[r];
    const int64_t top_k = settings.top_k.defined() ? settings.top_k.data<int32_t>()[r] : 0;
    const float top_p = settings.top_p.defined() ? settings.top_p.data<float>()[r] : 1.0f;
    out.data<int32_t>()[r] =
        t == 0.0f ? static_cast<int32_t>(std::max_element(row, row + V) - row)
                  : filtered_gumbel_argmax(row, V, t, top_k, top_p, static_cast<uint64_t>(settings.keys.data<int64_t>()[r]));
  }
}

void Ops::penalize(Tensor& logits, const PenaltySettings& settings) {
  const auto on_host = [](const Tensor& t) { return t.device() == Device::kCpu; };
  check(on_host(logits) && on_host(settings.row_offsets) && on_host(settings.tokens) && on_host(settings.generated) &&
            on_host(settings.bias) && on_host(settings.penalties),
        "penalize: host tensors expected");
  expect(logits, DType::kF32, {-1, -1}, "penalize logits");
  const int64_t R = logits.dim(0), V = logits.dim(1), N = settings.tokens.numel();
  expect(settings.row_offsets, DType::kI32, {R + 1}, "penalize row_offsets");
  expect(settings.tokens, DType::kI32, {N}, "penalize tokens");
  expect(settings.generated, DType::kI32, {N}, "penalize generated");
  expect(settings.bias, DType::kF32, {N}, "penalize bias");
  expect(settings.penalties, DType::kF32, {R, 3}, "penalize penalties");
  const int32_t* offsets = settings.row_offsets.data<int32_t>();
  for (int64_t r = 0; r < R; ++r) {
    const float* p = settings.penalties.data<float>() + r * 3;
    float* row = logits.data<float>() + r * V;
    check(offsets[r] >= 0 && offsets[r] <= offsets[r + 1] && offsets[r + 1] <= N, "penalize: bad row_offsets");
    for (int32_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      const int32_t t = settings.tokens.data<int32_t>()[i];
      check(t >= 0 && t < V, "penalize: token ", t, " outside the vocabulary of ", V);
      row[t] = penalized_logit(row[t], settings.generated.data<int32_t>()[i], settings.bias.data<float>()[i], p[0],
                               p[1], p[2]);
    }
  }
}

void Ops::add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  add(x, y);
  rms_norm(x, weight, eps, out);
}

void Ops::all_reduce_add_rms_norm(Communicator& group, Tensor& y, Tensor& x, const Tensor* post_weight,
                                  const Tensor& weight, float eps, Tensor& out) {
  group.all_reduce_sum(y);
  reduce_add_rms_norm(nullptr, y, x, post_weight, weight, eps, out);
}

void Ops::reduce_add_rms_norm(Communicator* group, Tensor& y, Tensor& x, const Tensor* post_weight,
                              const Tensor& weight, float eps, Tensor& out) {
  if (group != nullptr) return all_reduce_add_rms_norm(*group, y, x, post_weight, weight, eps, out);
  if (post_weight == nullptr) return add_rms_norm(x, y, weight, eps, out);
  rms_norm(y, *post_weight, eps, out);
  add_rms_norm(x, out, weight, eps, out);
}

void Ops::rope_attention(Tensor& qkv, double theta, KvCacheLayer& cache, KvCacheDType cache_dtype,
                         const ForwardBatch& batch, const AttentionParams& params, Tensor& out) {
  rope(qkv, batch.positions, params, theta);
  attention(qkv, cache, cache_dtype, batch, params, out);
}

std::unique_ptr<RecordedStep> Ops::record(const std::function<void()>& /*step*/) { return nullptr; }

}  // namespace nibble
