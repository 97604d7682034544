// Tensor: a dense row-major array of one DType on one device, sharing ownership of its memory.
// It is deliberately small: shape, dtype, device and a pointer. Views (reshape, row slices) share the
// owner. No strides: every tensor nibble passes between ops is contiguous.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace nibble {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled CPU tensor (64-byte aligned).
  static Tensor zeros(DType dtype, Shape shape);
  // Wraps memory someone else owns; `owner` keeps it alive (an mmap, a cudaMalloc, ...).
  static Tensor wrap(void* data, DType dtype, Shape shape, Device device,
                     std::shared_ptr<void> owner);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
  int64_t numel() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return data_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }

  // Same memory, new shape with the same element count (one dimension may be -1).
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) along dimension 0.
  Tensor slice(int64_t begin, int64_t end) const;
  // Row `index` along dimension 0, that dimension dropped.
  Tensor operator[](int64_t index) const;

  std::string describe() const;  // "BF16[4, 8] on cpu"

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
};

// A new CPU I32 tensor holding `values` (count must match the shape).
Tensor host_i32(const std::vector<int32_t>& values, Shape shape);

// Fails with a message naming `what` unless `t` has this dtype and shape (-1 matches any size).
void expect(const Tensor& t, DType dtype, const Shape& shape, const std::string& what);

}  // namespace nibble
