// INT4 per-output-channel symmetric quantization and the "reorder" packing (DESIGN.md §2): the one
// definition of nibble's on-disk INT4 format. Weights are W[out, in] row-major; packing runs along `in`.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace nibble {

inline constexpr int kInt4Max = 7;
inline constexpr int kInt4PerWord = 8;
// Nibble i of a packed int32 holds element kInt4PackOrder[i] of its group of 8 consecutive k.
inline constexpr std::array<int, 8> kInt4PackOrder{0, 2, 4, 6, 1, 3, 5, 7};

struct Int4Weight {
  Tensor packed;  // I32 (out, in / 8), reorder-packed
  Tensor scale;   // F32 (out): W ≈ q × scale[o]
};

// scale[o] = max_k |W[o,k]| / 7 (1 for an all-zero row); q = clamp(round_half_even(W / scale), -7, 7).
// `weight` is (out, in) of F32, BF16 or F16 on the CPU; `in` must be a multiple of 8.
Int4Weight quantize_int4(const Tensor& weight);

// Codes (out, in) int8 in [-8, 7] -> I32 (out, in / 8) and back.
Tensor pack_int4(const Tensor& codes);
Tensor unpack_int4(const Tensor& packed);

// The signed value at column k of a packed row.
inline int int4_at(const int32_t* row, int64_t k) {
  static constexpr std::array<int, 8> kSlotOf{0, 4, 1, 5, 2, 6, 3, 7};  // inverse of kInt4PackOrder
  const uint32_t word = static_cast<uint32_t>(row[k / kInt4PerWord]);
  const int nibble = static_cast<int>((word >> (4 * kSlotOf[k % kInt4PerWord])) & 0xF);
  return nibble >= 8 ? nibble - 16 : nibble;
}

}  // namespace nibble
