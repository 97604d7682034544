// FP8 quantizers and float readers.
#include "quant/fp8_quant.h"

#include <algorithm>
#include <cmath>

#include "core/bf16.h"
#include "core/fp8.h"

namespace nibble {

void to_float(const Tensor& t, std::span<float> out) {
  check(t.device() == Device::kCpu, "to_float: ", t.describe(), " is not on the CPU");
  check(out.size() == static_cast<std::size_t>(t.numel()), "to_float: size mismatch");
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32:
      std::copy_n(t.data<float>(), n, out.begin());
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(t.data<Bf16>()[i]);
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(t.data<uint16_t>()[i]);
      return;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = fp8_e4m3_to_float(t.data<uint8_t>()[i]);
      return;
    default:
      fail("to_float: ", t.describe(), " is not a floating-point tensor");
  }
}

Tensor to_f32(const Tensor& t) {
  Tensor out = Tensor::zeros(DType::kF32, t.shape());
  to_float(t, {out.data<float>(), static_cast<std::size_t>(out.numel())});
  return out;
}

Fp8Weight quantize_fp8_per_tensor(const Tensor& weight) {
  const Tensor w = to_f32(weight);
  const float* v = w.data<float>();
  float amax = 0.0f;
  for (int64_t i = 0; i < w.numel(); ++i) amax = std::max(amax, std::fabs(v[i]));
  Fp8Weight out{.weight = Tensor::zeros(DType::kF8E4M3, weight.shape()),
                .scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f};
  uint8_t* q = out.weight.data<uint8_t>();
  for (int64_t i = 0; i < w.numel(); ++i) q[i] = float_to_fp8_e4m3(v[i] / out.scale);
  return out;
}

float quantize_fp8_row(std::span<const float> x, std::span<uint8_t> out, float static_scale) {
  float scale = static_scale;
  if (scale <= 0.0f) {
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    scale = std::max(amax, kMinActivationAmax) / kFp8E4M3Max;
  }
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = float_to_fp8_e4m3(x[i] / scale);
  return scale;
}

}  // namespace nibble
