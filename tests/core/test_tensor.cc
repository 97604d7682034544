// Tensor views and .npy round trips.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/npy.h"
#include "core/tensor.h"

namespace nibble {
namespace {

TEST(Tensor, ViewsShareMemory) {
  Tensor t = Tensor::zeros(DType::kF32, {3, 4});
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = static_cast<float>(i);
  EXPECT_EQ(t[1].data<float>()[0], 4.0f);
  EXPECT_EQ(t.slice(1, 3).shape(), (Shape{2, 4}));
  EXPECT_EQ(t.reshape({-1}).dim(0), 12);
  EXPECT_EQ(t.reshape({2, -1}).shape(), (Shape{2, 6}));
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.slice(2, 4), Error);
}

TEST(Npy, RoundTrips) {
  const auto path = std::filesystem::temp_directory_path() / "nibble_test.npy";
  Tensor t = Tensor::zeros(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = 0.5f * static_cast<float>(i) - 1.0f;
  write_npy(path, t);
  const Tensor back = read_npy(path);
  ASSERT_EQ(back.shape(), t.shape());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.data<float>()[i], t.data<float>()[i]);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace nibble
