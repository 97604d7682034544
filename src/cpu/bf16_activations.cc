// Bf16ActivationOps: CpuOps, then the outputs rounded to BF16 values.
#include "cpu/bf16_activations.h"

#include <algorithm>

#include "core/bf16.h"

namespace nibble {
namespace {

void round_activations(Tensor& t) {
  if (t.dtype() != DType::kF32) return;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
}

// An input as the GPU reads it: BF16 values stay, a tensor-parallel F32 sum is rounded to BF16.
Tensor rounded(const Tensor& t) {
  Tensor copy = Tensor::zeros(t.dtype(), t.shape());
  std::copy_n(t.data<float>(), t.numel(), copy.data<float>());
  round_activations(copy);
  return copy;
}

}  // namespace

void Bf16ActivationOps::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  cpu_.embedding(ids, table, out);
  round_activations(out);
}

void Bf16ActivationOps::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  cpu_.rms_norm(rounded(x), weight, eps, out);
  round_activations(out);
}

void Bf16ActivationOps::add(Tensor& x, const Tensor& y) {
  cpu_.add(x, rounded(y));
  round_activations(x);
}

void Bf16ActivationOps::scale(Tensor& x, float factor) {
  cpu_.scale(x, factor);
  if (x.raw() != last_logits_) round_activations(x);
}

void Bf16ActivationOps::linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group) {
  cpu_.linear(x, w, out, row_group);
  if (row_group == nullptr) round_activations(out);  // else a partial sum, F32 as on the GPU
}

void Bf16ActivationOps::logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) {
  cpu_.logits(x, rows, w, out);
  last_logits_ = out.raw();
}

void Bf16ActivationOps::rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) {
  cpu_.rope(qkv, positions, params, theta);
  round_activations(qkv);
}

void Bf16ActivationOps::attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                                  const ForwardBatch& batch, const AttentionParams& params, Tensor& out) {
  cpu_.attention(qkv, cache, cache_dtype, batch, params, out);
  round_activations(out);
}

void Bf16ActivationOps::moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) {
  cpu_.moe(x, w, params, out);
  if (params.communicator == nullptr) round_activations(out);  // else a partial sum, as linear's
}

}  // namespace nibble
