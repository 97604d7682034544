// safetensors checkpoints: strict header parsing, mmap'd reading of one file or of the shards named
// by model.safetensors.index.json, and writing. Every error names the file and, where there is one,
// the tensor. Tensors returned by a reader are zero-copy CPU views that keep the mapping alive.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace nibble {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the 8-byte length and header)
  uint64_t end = 0;
};

// Parses and validates a safetensors JSON header. `data_size` is the size of the data section.
// Checks: valid JSON object; known dtypes; shapes of non-negative integers; end - begin equals
// numel × dtype size; offsets inside the data section; no two tensors overlapping. `__metadata__`
// must be an object of strings. `source` (a file name) prefixes every error message.
// The result is sorted by data offset.
std::vector<TensorInfo> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                 const std::string& source);

// One mmap'd .safetensors file.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name) const;  // CPU view into the mapping (read-only memory)

 private:
  std::filesystem::path path_;
  std::shared_ptr<void> mapping_;    // unmaps on destruction
  const std::byte* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A model directory's weights: `model.safetensors`, or `model.safetensors.index.json` and its
// shards, or else every `*.safetensors` in the directory. Tensor names are unique across shards.
class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;
  Tensor get(
      const std::string& name) const;  // fails naming the tensor and the directory if missing
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::size_t> owner_;  // tensor name -> index into files_
};

// Writes `tensors` (CPU, any supported dtype) to one .safetensors file, in the given order,
// laid out as the reference writer does: the header is space-padded so the data section starts
// 8-byte aligned, and tensors follow back to back (the reference reader rejects gaps). A tensor is
// thus aligned when the bytes before it are a multiple of its element size (larger dtypes first).
// The file is written beside `path` and renamed over it, so a failure leaves any old file intact.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace nibble
