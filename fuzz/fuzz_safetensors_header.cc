// libFuzzer target for the safetensors reader: each input is a whole file image (8-byte length,
// JSON header, data) run through the same validation SafetensorsFile::open uses. A nibble::Error is
// the expected answer to junk; any other exception, a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "format/safetensors_parse.h"

namespace {

// What a successful parse promises its callers; a broken promise is a crash worth reporting.
void check_layout(std::span<const std::byte> image, const nibble::SafetensorsLayout& layout) {
  if (layout.data_offset + layout.data_size != image.size()) __builtin_trap();
  for (const auto& t : layout.tensors) {
    const uint64_t bytes = static_cast<uint64_t>(
        nibble::Tensor::wrap(nullptr, t.dtype, t.shape, nibble::Device::kCpu, nullptr).nbytes());
    if (t.begin > t.end || t.end > layout.data_size || t.end - t.begin != bytes) __builtin_trap();
    if (bytes > 0) {  // touch both ends so AddressSanitizer sees any out-of-range view
      volatile std::byte first = image[layout.data_offset + t.begin];
      volatile std::byte last = image[layout.data_offset + t.end - 1];
      (void)first;
      (void)last;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_layout(image, nibble::parse_safetensors_image(image, "fuzz.safetensors"));
  } catch (const nibble::Error&) {
  }
  // The header parser alone, on the bytes after the length, with that length read as the data
  // size: random inputs rarely carry a consistent length, and this reaches the JSON checks anyway.
  if (size >= 8) {
    uint64_t data_size = 0;
    for (int i = 7; i >= 0; --i) data_size = data_size << 8 | data[i];
    const std::string_view header(reinterpret_cast<const char*>(data) + 8, size - 8);
    try {
      (void)nibble::parse_safetensors_header(header, data_size, "fuzz-header.json");
    } catch (const nibble::Error&) {
    }
  }
  return 0;
}
