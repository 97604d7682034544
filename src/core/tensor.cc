// Tensor construction and views.
#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>

namespace nibble {

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

int64_t Tensor::numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<>());
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  for (int64_t d : shape) check(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  const std::size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  check(p != nullptr, "out of host memory allocating ", bytes, " bytes");
  std::memset(p, 0, bytes == 0 ? 64 : bytes);
  t.owner_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  t.data_ = p;
  return t;
}

Tensor Tensor::wrap(void* data, DType dtype, Shape shape, Device device,
                    std::shared_ptr<void> owner) {
  Tensor t;
  t.owner_ = std::move(owner);
  t.data_ = data;
  t.dtype_ = dtype;
  t.device_ = device;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1;
  int free_dim = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      check(free_dim < 0, "reshape ", shape_str(shape), ": more than one -1");
      free_dim = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (free_dim >= 0 && known > 0) shape[free_dim] = numel() / known;
  Tensor t = *this;
  t.shape_ = std::move(shape);
  check(t.numel() == numel(), "cannot reshape ", describe(), " to ", shape_str(t.shape_));
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  check(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end,
        ") out of range for ", describe());
  Tensor t = *this;
  const std::size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / shape_[0];
  t.data_ = static_cast<std::byte*>(data_) + begin * row_bytes;
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::operator[](int64_t index) const {
  Tensor t = slice(index, index + 1);
  t.shape_.erase(t.shape_.begin());
  return t;
}

std::string Tensor::describe() const {
  return cat(dtype_name(dtype_), shape_str(shape_), device_ == Device::kCpu ? " on cpu" : " on cuda");
}

Tensor host_i32(const std::vector<int32_t>& values, Shape shape) {
  Tensor t = Tensor::zeros(DType::kI32, std::move(shape));
  check(t.numel() == static_cast<int64_t>(values.size()), "host_i32: ", values.size(), " values for shape ",
        shape_str(t.shape()));
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

void expect(const Tensor& t, DType dtype, const Shape& shape, const std::string& what) {
  bool ok = t.dtype() == dtype && t.rank() == static_cast<int>(shape.size());
  for (std::size_t i = 0; ok && i < shape.size(); ++i)
    ok = shape[i] == -1 || shape[i] == t.shape()[i];
  check(ok, what, ": expected ", dtype_name(dtype), shape_str(shape), ", got ", t.describe());
}

}  // namespace nibble
