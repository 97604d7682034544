// The file-image half of the safetensors reader: validates a whole in-memory image
// (8-byte little-endian header length, JSON header, data section) without touching the file system,
// so the mmap'd reader and the fuzz target run exactly the same checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/safetensors.h"

namespace nibble {

// Headers longer than this are refused before parsing: real ones are a few hundred kilobytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

struct SafetensorsLayout {
  std::vector<TensorInfo> tensors;  // in header order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // start of the data section in the image: 8 + header length
  uint64_t data_size = 0;
};

// parse_safetensors_header that also returns `__metadata__`.
SafetensorsLayout parse_safetensors_header_full(std::string_view header, uint64_t data_size,
                                                const std::string& source);

// Validates a whole file image; `source` prefixes every error message.
SafetensorsLayout parse_safetensors_image(std::span<const std::byte> image,
                                          const std::string& source);

}  // namespace nibble
