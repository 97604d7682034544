// Broken safetensors files, crafted byte by byte: every one must be refused with a one-line
// nibble::Error that names the file and, where there is one, the tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "format/safetensors_parse.h"
#include "format_test_util.h"

namespace nibble {
namespace {

constexpr const char* kFile = "model-00001-of-00002.safetensors";
constexpr const char* kName = "model.layers.0.self_attn.q_proj.weight";

class SafetensorsErrors : public ::testing::Test {
 protected:
  // Writes `bytes` as kFile and opens it.
  std::shared_ptr<SafetensorsFile> open_bytes(const std::string& bytes) {
    test::write_file(path(), bytes);
    return SafetensorsFile::open(path());
  }
  // Opens a file with this header and `data_size` bytes of data.
  std::shared_ptr<SafetensorsFile> open_header(const std::string& header,
                                               std::size_t data_size = 0) {
    return open_bytes(test::image(header, std::string(data_size, '\x5a')));
  }
  // A header holding one tensor entry named kName.
  static std::string one(const std::string& entry) {
    return std::string(R"({")") + kName + R"(":)" + entry + "}";
  }
  std::filesystem::path path() const { return dir_ / kFile; }

  test::TempDir dir_;
};

TEST_F(SafetensorsErrors, FileTooShort) {
  EXPECT_ERROR(open_bytes(""), kFile, "file is 0 bytes", "too short");
  EXPECT_ERROR(open_bytes(std::string("\x02\0\0\0\0", 5)), kFile, "file is 5 bytes");
}

TEST_F(SafetensorsErrors, HeaderLengthLies) {
  EXPECT_ERROR(open_bytes(test::image_with_length(1000, "{}", "")), kFile, "header length 1000",
               "exceeds the 2 bytes");
  EXPECT_ERROR(open_bytes(test::image_with_length(~0ull, "{}", "")), kFile,
               "header length 18446744073709551615");
}

TEST_F(SafetensorsErrors, HeaderLengthAbsurd) {
  // A sparse file just over the limit: the length fits in the file but is not plausible.
  const uint64_t length = kMaxSafetensorsHeaderBytes + 1;
  test::write_file(path(), test::image_with_length(length, "{}", ""));
  ASSERT_EQ(::truncate(path().c_str(), static_cast<off_t>(8 + length)), 0);
  EXPECT_ERROR(SafetensorsFile::open(path()), kFile, "header length 104857601", "implausible");
}

TEST_F(SafetensorsErrors, HeaderNotJson) {
  EXPECT_ERROR(open_header("{not json"), kFile, "header is not valid JSON");
  EXPECT_ERROR(open_header(""), kFile, "header is not valid JSON");
  EXPECT_ERROR(open_header(std::string("{\"a\xff\":1}")), kFile, "not valid JSON");
  EXPECT_ERROR(open_header(std::string("{}\0\0", 4)), kFile, "not valid JSON");
  EXPECT_ERROR(open_header("[1, 2]"), kFile, "header must be a JSON object, got array");
  EXPECT_ERROR(open_header("7"), kFile, "got number");
}

TEST_F(SafetensorsErrors, EntryShape) {
  EXPECT_ERROR(open_header(one("[]")), kFile, kName, "entry must be an object");
  EXPECT_ERROR(open_header(one(R"({"shape":[1],"data_offsets":[0,2]})")), kFile, kName,
               "missing \"dtype\"");
  EXPECT_ERROR(open_header(one(R"({"dtype":"BF16","data_offsets":[0,2]})")), kFile, kName,
               "missing \"shape\"");
  EXPECT_ERROR(open_header(one(R"({"dtype":"BF16","shape":[1]})")), kFile, kName,
               "missing \"data_offsets\"");
}

TEST_F(SafetensorsErrors, BadDtype) {
  EXPECT_ERROR(open_header(one(R"({"dtype":2,"shape":[1],"data_offsets":[0,2]})"), 2), kFile, kName,
               "\"dtype\" must be a string, got number");
  EXPECT_ERROR(open_header(one(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"), 8), kFile,
               kName, "unknown dtype \"F64\"",
               "supported: F32, F16, BF16, F8_E4M3, I32, I8, U8, I64");
  EXPECT_ERROR(open_header(one(R"({"dtype":"bf16","shape":[1],"data_offsets":[0,2]})"), 2), kName,
               "unknown dtype \"bf16\"");
}

TEST_F(SafetensorsErrors, BadShape) {
  const auto with_shape = [&](const std::string& shape) {
    return open_header(one(R"({"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,4]})"), 4);
  };
  EXPECT_ERROR(with_shape("4"), kFile, kName, "\"shape\" must be an array of integers, got number");
  EXPECT_ERROR(with_shape("[-4]"), kFile, kName, "negative dimension -4");
  EXPECT_ERROR(with_shape("[4.0]"), kFile, kName, "non-negative integers, got 4.0");
  EXPECT_ERROR(with_shape("[2.5]"), kFile, kName, "got 2.5");
  EXPECT_ERROR(with_shape(R"(["4"])"), kFile, kName, "got string");
  EXPECT_ERROR(with_shape("[9223372036854775808]"), kFile, kName, "too large");
  EXPECT_ERROR(with_shape("[18446744073709551616]"), kFile, kName, "non-negative integers");
}

TEST_F(SafetensorsErrors, SizeOverflow) {
  // 2^32 × 2^32 wraps to 0 in 64 bits; 2^31 × 2^31 F32 elements wrap only in the byte count.
  EXPECT_ERROR(
      open_header(one(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]})")),
      kFile, kName, "overflows 64 bits");
  EXPECT_ERROR(
      open_header(one(R"({"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]})")),
      kFile, kName, "overflows 64 bits");
  EXPECT_ERROR(
      open_header(one(R"({"dtype":"U8","shape":[3037000500,3037000500],"data_offsets":[0,0]})")),
      kFile, kName, "overflows 64 bits");  // numel fits u64 but not int64
}

TEST_F(SafetensorsErrors, OffsetsMismatchShape) {
  const std::string message = test::error_of(
      [&] { open_header(one(R"({"dtype":"BF16","shape":[8,8],"data_offsets":[0,100]})"), 128); });
  EXPECT_EQ(message, path().string() + ": tensor \"" + kName +
                         "\": data_offsets [0, 100] do not match shape [8, 8] × BF16 (128 bytes)");
}

TEST_F(SafetensorsErrors, BadOffsets) {
  const auto with_offsets = [&](const std::string& offsets, std::size_t data = 16) {
    return open_header(one(R"({"dtype":"U8","shape":[4],"data_offsets":)" + offsets + "}"), data);
  };
  EXPECT_ERROR(with_offsets("[0]"), kFile, kName, "\"data_offsets\" must be two", "got [0]");
  EXPECT_ERROR(with_offsets("[0,4,8]"), kName, "must be two");
  EXPECT_ERROR(with_offsets("[-1,3]"), kName, "must be two");
  EXPECT_ERROR(with_offsets(R"(["0","4"])"), kName, "must be two");
  EXPECT_ERROR(with_offsets("{}"), kName, "must be two", "got object");
  EXPECT_ERROR(with_offsets("[8,4]"), kFile, kName, "data_offsets [8, 4] end before they begin");
  EXPECT_ERROR(with_offsets("[14,18]"), kFile, kName,
               "data_offsets [14, 18] lie outside the data section (16 bytes)");
  EXPECT_ERROR(with_offsets("[18446744073709551615,3]"), kFile, kName, "end before they begin");
}

TEST_F(SafetensorsErrors, TruncatedData) {
  test::TempDir dir;
  Tensor t = Tensor::zeros(DType::kF32, {16});
  write_safetensors(dir / "good.safetensors", {{"w", t}});
  std::string bytes = test::read_file(dir / "good.safetensors");
  bytes.resize(bytes.size() - 4);
  EXPECT_ERROR(open_bytes(bytes), kFile, "tensor \"w\"", "outside the data section (60 bytes)");
}

TEST_F(SafetensorsErrors, Overlap) {
  const std::string header =
      R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}})";
  EXPECT_ERROR(open_header(header, 24), kFile, "tensors \"a\" [0, 16] and \"b\" [8, 24] overlap");
  // A small tensor inside a big one, with a neighbour that touches without overlapping.
  const std::string nested =
      R"({"big":{"dtype":"U8","shape":[32],"data_offsets":[4,36]},"early":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("inner":{"dtype":"U8","shape":[2],"data_offsets":[20,22]}})";
  EXPECT_ERROR(open_header(nested, 36), kFile,
               "tensors \"big\" [4, 36] and \"inner\" [20, 22] overlap");
}

TEST_F(SafetensorsErrors, DuplicateNames) {
  const std::string header =
      R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_ERROR(open_header(header, 2), kFile, "tensor \"w\" appears twice");
  EXPECT_ERROR(open_header(R"({"__metadata__":{},"__metadata__":{}})"), kFile,
               "\"__metadata__\" appears twice");
}

TEST_F(SafetensorsErrors, Metadata) {
  EXPECT_ERROR(open_header(R"({"__metadata__":[]})"), kFile,
               "__metadata__ must be an object of strings, got array");
  EXPECT_ERROR(open_header(R"({"__metadata__":{"format":"pt","step":3}})"), kFile,
               "__metadata__ \"step\" must be a string, got number");
  EXPECT_TRUE(open_header(R"({"__metadata__":null})")->metadata().empty());
}

TEST_F(SafetensorsErrors, NamesAreEscapedInMessages) {
  // A tensor name with a newline and an invalid byte must not break the one-line message.
  const std::string header =
      "{\"bad\\nname\\u0001\":{\"dtype\":\"XX\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_ERROR(open_header(header, 1), kFile, "tensor \"bad\\x0aname\\x01\"",
               "unknown dtype \"XX\"");
  const std::string quote = R"({"a\"b":{"dtype":"XX","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_ERROR(open_header(quote, 1), "tensor \"a\\\"b\"");
}

TEST_F(SafetensorsErrors, ParseHeaderDirectly) {
  EXPECT_ERROR(parse_safetensors_header(one(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})"),
                                        3, "h.json"),
               "h.json: tensor \"", kName, "outside the data section (3 bytes)");
  const auto tensors = parse_safetensors_header(
      one(R"({"dtype":"I64","shape":[2,1],"data_offsets":[8,24]})"), 24, "h");
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].name, kName);
  EXPECT_EQ(tensors[0].dtype, DType::kI64);
  EXPECT_EQ(tensors[0].shape, (Shape{2, 1}));
  EXPECT_EQ(tensors[0].begin, 8u);
  EXPECT_EQ(tensors[0].end, 24u);
}

TEST_F(SafetensorsErrors, NotARegularFile) {
  EXPECT_ERROR(SafetensorsFile::open(dir_.path()), dir_.path().string(), "not a regular file");
  EXPECT_ERROR(SafetensorsFile::open(dir_ / "absent.safetensors"), "absent.safetensors",
               "cannot open");
}

}  // namespace
}  // namespace nibble
