// Helpers for the format tests: a scratch directory that cleans itself up, raw file writing for
// hand-crafted (often broken) safetensors images, and catching the message of a nibble::Error.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace nibble::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "nibble-format-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A safetensors image: `length` as the 8-byte little-endian header length, then header and data.
inline std::string image_with_length(uint64_t length, std::string_view header,
                                     std::string_view data) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((length >> (8 * i)) & 0xFF);
  bytes += header;
  bytes += data;
  return bytes;
}

inline std::string image(std::string_view header, std::string_view data) {
  return image_with_length(header.size(), header, data);
}

// The message of the nibble::Error `f` throws ("" and a test failure if it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a nibble::Error";
  return "";
}

// Asserts `f` throws a one-line nibble::Error containing every one of `parts`.
#define EXPECT_ERROR(statement, ...)                                                   \
  do {                                                                                 \
    const std::string message_ = ::nibble::test::error_of([&] { (void)(statement); }); \
    EXPECT_EQ(message_.find('\n'), std::string::npos) << message_;                     \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})             \
      EXPECT_NE(message_.find(part_), std::string::npos)                               \
          << "message: " << message_ << "\nexpected to contain: " << part_;            \
  } while (0)

}  // namespace nibble::test
