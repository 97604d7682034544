// Bf16ActivationOps: inputs read as F32 values, CpuOps, outputs stored in their tensor's dtype.
#include "cpu/bf16_activations.h"

#include "core/bf16.h"

namespace nibble {
namespace {

void check_dtype(const Tensor& t, const char* what) {
  check(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16, what, " ", t.describe(), " is not F32 or BF16");
}

// The values of an F32 or BF16 tensor as F32: the tensor itself when F32, else a copy (exact).
Tensor f32_values(const Tensor& t, const char* what) {
  check_dtype(t, what);
  if (t.dtype() == DType::kF32) return t;
  Tensor out = Tensor::zeros(DType::kF32, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) out.data<float>()[i] = bf16_to_float(t.data<Bf16>()[i]);
  return out;
}

// Where an op writes its F32 result for `out`: out itself when F32, else a scratch tensor.
Tensor f32_result(const Tensor& out, const char* what) {
  check_dtype(out, what);
  return out.dtype() == DType::kF32 ? out : Tensor::zeros(DType::kF32, out.shape());
}

// out = result, stored in out's dtype (BF16: rounded to nearest even). Nothing to do when result is out.
void store(const Tensor& result, Tensor& out) {
  if (result.raw() == out.raw()) return;
  for (int64_t i = 0; i < out.numel(); ++i) out.data<Bf16>()[i] = float_to_bf16(result.data<float>()[i]);
}

}  // namespace

void Bf16ActivationOps::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  Tensor r = f32_result(out, "embedding output");
  cpu_.embedding(ids, table, r);
  store(r, out);
}

void Bf16ActivationOps::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  Tensor r = f32_result(out, "rms_norm output");
  cpu_.rms_norm(f32_values(x, "rms_norm input"), weight, eps, r);
  store(r, out);
}

void Bf16ActivationOps::add(Tensor& x, const Tensor& y) {
  Tensor r = f32_values(x, "add x");
  cpu_.add(r, f32_values(y, "add y"));
  store(r, x);
}

void Bf16ActivationOps::scale(Tensor& x, float factor) {
  Tensor r = f32_values(x, "scale input");
  cpu_.scale(r, factor);
  store(r, x);
}

void Bf16ActivationOps::linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group) {
  Tensor r = f32_result(out, "linear output");
  cpu_.linear(f32_values(x, "linear input"), w, r, row_group);
  store(r, out);
}

void Bf16ActivationOps::logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) {
  cpu_.logits(f32_values(x, "logits input"), rows, w, out);
}

void Bf16ActivationOps::rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params, double theta) {
  Tensor r = f32_values(qkv, "rope qkv");
  cpu_.rope(r, positions, params, theta);
  store(r, qkv);
}

void Bf16ActivationOps::attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                                  const ForwardBatch& batch, const AttentionParams& params, Tensor& out) {
  Tensor r = f32_result(out, "attention output");
  cpu_.attention(f32_values(qkv, "attention qkv"), cache, cache_dtype, batch, params, r);
  store(r, out);
}

void Bf16ActivationOps::moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) {
  Tensor r = f32_result(out, "moe output");
  cpu_.moe(f32_values(x, "moe input"), w, params, r);
  store(r, out);
}

}  // namespace nibble
