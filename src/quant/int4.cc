// INT4 quantizer and reorder packing.
#include "quant/int4.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "quant/fp8_quant.h"

namespace nibble {

Int4Weight quantize_int4(const Tensor& weight) {
  check(weight.rank() == 2, "quantize_int4: expected a 2-D weight, got ", weight.describe());
  const int64_t rows = weight.dim(0), cols = weight.dim(1);
  check(cols % kInt4PerWord == 0, "quantize_int4: input size ", cols, " is not a multiple of 8");
  const Tensor w = to_f32(weight);
  Tensor codes = Tensor::zeros(DType::kI8, {rows, cols});
  Int4Weight out{.packed = {}, .scale = Tensor::zeros(DType::kF32, {rows})};
  for (int64_t o = 0; o < rows; ++o) {
    const float* row = w.data<float>() + o * cols;
    float amax = 0.0f;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(row[k]));
    const float scale = amax > 0.0f ? amax / static_cast<float>(kInt4Max) : 1.0f;
    out.scale.data<float>()[o] = scale;
    int8_t* q = codes.data<int8_t>() + o * cols;
    for (int64_t k = 0; k < cols; ++k) {
      const float r = std::nearbyint(row[k] / scale);  // default rounding mode: half to even
      q[k] = static_cast<int8_t>(std::clamp(r, -static_cast<float>(kInt4Max), static_cast<float>(kInt4Max)));
    }
  }
  out.packed = pack_int4(codes);
  return out;
}

Tensor pack_int4(const Tensor& codes) {
  expect(codes, DType::kI8, {-1, -1}, "pack_int4 codes");
  const int64_t rows = codes.dim(0), cols = codes.dim(1);
  check(cols % kInt4PerWord == 0, "pack_int4: input size ", cols, " is not a multiple of 8");
  Tensor packed = Tensor::zeros(DType::kI32, {rows, cols / kInt4PerWord});
  const int8_t* q = codes.data<int8_t>();
  int32_t* p = packed.data<int32_t>();
  for (int64_t w = 0; w < rows * cols / kInt4PerWord; ++w) {
    uint32_t word = 0;
    for (int i = 0; i < kInt4PerWord; ++i) {
      const int8_t v = q[w * kInt4PerWord + kInt4PackOrder[i]];
      check(v >= -8 && v <= 7, "pack_int4: code ", int{v}, " out of range");
      word |= (static_cast<uint32_t>(v) & 0xFu) << (4 * i);
    }
    p[w] = static_cast<int32_t>(word);
  }
  return packed;
}

Tensor unpack_int4(const Tensor& packed) {
  expect(packed, DType::kI32, {-1, -1}, "unpack_int4 packed");
  const int64_t rows = packed.dim(0), cols = packed.dim(1) * kInt4PerWord;
  Tensor codes = Tensor::zeros(DType::kI8, {rows, cols});
  for (int64_t o = 0; o < rows; ++o) {
    const int32_t* row = packed.data<int32_t>() + o * packed.dim(1);
    for (int64_t k = 0; k < cols; ++k) codes.data<int8_t>()[o * cols + k] = static_cast<int8_t>(int4_at(row, k));
  }
  return codes;
}

}  // namespace nibble
