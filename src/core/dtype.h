// Element types nibble stores and computes with, described once in a traits table.
// Names follow safetensors ("BF16", "F8_E4M3", ...). Packed INT4 lives in I32 tensors (8 values a word).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nibble {

// kF8E4M3FnUz: ROCm's e4m3fnuz bytes as a checkpoint may store them; loaders convert them to kF8E4M3.
enum class DType : uint8_t { kF32, kF16, kBF16, kF8E4M3, kI32, kI8, kU8, kI64, kF8E4M3FnUz };

struct DTypeTraits {
  DType dtype;
  std::string_view safetensors_name;
  std::size_t size;  // bytes per element
};

inline constexpr std::array<DTypeTraits, 9> kDTypeTraits{{
    {.dtype = DType::kF32, .safetensors_name = "F32", .size = 4},
    {.dtype = DType::kF16, .safetensors_name = "F16", .size = 2},
    {.dtype = DType::kBF16, .safetensors_name = "BF16", .size = 2},
    {.dtype = DType::kF8E4M3, .safetensors_name = "F8_E4M3", .size = 1},
    {.dtype = DType::kI32, .safetensors_name = "I32", .size = 4},
    {.dtype = DType::kI8, .safetensors_name = "I8", .size = 1},
    {.dtype = DType::kU8, .safetensors_name = "U8", .size = 1},
    {.dtype = DType::kI64, .safetensors_name = "I64", .size = 8},
    {.dtype = DType::kF8E4M3FnUz, .safetensors_name = "F8_E4M3FNUZ", .size = 1},
}};

constexpr const DTypeTraits& traits(DType dtype) { return kDTypeTraits[static_cast<int>(dtype)]; }
constexpr std::size_t dtype_size(DType dtype) { return traits(dtype).size; }
constexpr std::string_view dtype_name(DType dtype) { return traits(dtype).safetensors_name; }

inline std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kDTypeTraits)
    if (t.safetensors_name == name) return t.dtype;
  return std::nullopt;
}

static_assert([] {
  for (int i = 0; i < static_cast<int>(kDTypeTraits.size()); ++i)
    if (static_cast<int>(kDTypeTraits[i].dtype) != i) return false;
  return true;
}(), "kDTypeTraits must be indexed by DType");

}  // namespace nibble
