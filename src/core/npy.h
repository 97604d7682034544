// NumPy .npy files (format version 1.0, little-endian, C order) for F32 and I32 tensors: how the
// `logits` command hands results to Python and how tests read reference outputs.
#pragma once

#include <filesystem>

#include "core/tensor.h"

namespace nibble {

void write_npy(const std::filesystem::path& path, const Tensor& tensor);
Tensor read_npy(const std::filesystem::path& path);

}  // namespace nibble
