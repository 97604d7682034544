// CpuOps: memory, embedding, RMSNorm, residual add, scaling, linear layers and logits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "cpu/cpu_ops.h"
#include "cpu/gemm.h"
#include "model/communicator.h"
#include "quant/fp8_quant.h"

namespace nibble {

Tensor CpuOps::empty(DType dtype, Shape shape) { return Tensor::zeros(dtype, std::move(shape)); }

Tensor CpuOps::upload(const Tensor& host) {
  check(host.device() == Device::kCpu, "upload: ", host.describe(), " is not a host tensor");
  return host;
}

Tensor CpuOps::download(const Tensor& device_tensor) { return device_tensor; }

void CpuOps::embedding(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t tokens = ids.dim(0), vocab = table.dim(0), hidden = table.dim(1);
  expect(table, DType::kBF16, {-1, -1}, "embedding table");
  expect(out, DType::kF32, {tokens, hidden}, "embedding output");
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t id = ids.data<int32_t>()[t];
    check(id >= 0 && id < vocab, "token id ", id, " is outside the vocabulary (", vocab, ")");
    const Bf16* row = table.data<Bf16>() + id * hidden;
    for (int64_t h = 0; h < hidden; ++h) out.data<float>()[t * hidden + h] = bf16_to_float(row[h]);
  }
}

void CpuOps::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  expect(x, DType::kF32, {-1, -1}, "rms_norm input");
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  expect(weight, DType::kBF16, {hidden}, "rms_norm weight");
  expect(out, DType::kF32, x.shape(), "rms_norm output");
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = x.data<float>() + t * hidden;
    float sum = 0.0f;
    for (int64_t h = 0; h < hidden; ++h) sum += xt[h] * xt[h];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + eps);
    for (int64_t h = 0; h < hidden; ++h)
      out.data<float>()[t * hidden + h] = xt[h] * inv * bf16_to_float(weight.data<Bf16>()[h]);
  }
}

void CpuOps::add(Tensor& x, const Tensor& y) {
  check(x.numel() == y.numel() && x.dtype() == DType::kF32 && y.dtype() == DType::kF32, "add: ", x.describe(),
        " += ", y.describe());
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += y.data<float>()[i];
}

void CpuOps::scale(Tensor& x, float factor) {
  expect(x, DType::kF32, x.shape(), "scale input");
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] *= factor;
}

void CpuOps::linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group) {
  expect(x, DType::kF32, {-1, w.in_features}, "linear input");
  expect(out, DType::kF32, {x.dim(0), w.out_features}, "linear output");
  const int64_t T = x.dim(0), K = w.in_features;
  Tensor row_scales;  // the dynamic per-row FP8 scales over every rank's slice of the rows
  if (row_group != nullptr && w.format != WeightFormat::kBf16 && w.input_scale <= 0.0f) {
    row_scales = Tensor::zeros(DType::kF32, {T});
    float* amax = row_scales.data<float>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) amax[t] = std::max(amax[t], std::fabs(x.data<float>()[t * K + k]));
    row_group->all_reduce_max(row_scales);
    for (int64_t t = 0; t < T; ++t) amax[t] = std::max(amax[t], kMinActivationAmax) / kFp8E4M3Max;
  }
  gemm(x.data<float>(), T, view_of(w), out.data<float>(), row_scales.numel() > 0 ? row_scales.data<float>() : nullptr);
}

void CpuOps::logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) {
  const int64_t hidden = x.dim(1), count = rows.dim(0);
  std::vector<float> gathered(count * hidden);
  for (int64_t r = 0; r < count; ++r) {
    const int32_t row = rows.data<int32_t>()[r];
    check(row >= 0 && row < x.dim(0), "logits: row ", row, " outside the batch");
    std::memcpy(&gathered[r * hidden], x.data<float>() + row * hidden, hidden * sizeof(float));
  }
  expect(out, DType::kF32, {count, w.out_features}, "logits output");
  gemm(gathered.data(), count, view_of(w), out.data<float>());
}

}  // namespace nibble
