// safetensors reading and writing that should work: round trips of every dtype, the on-disk layout
// the reference writer produces, model directories (single file, indexed shards, bare shards).
#include <gtest/gtest.h>

#include <cstring>

#include "format/safetensors.h"
#include "format/safetensors_parse.h"
#include "format_test_util.h"

namespace nibble {
namespace {

using test::TempDir;

// A tensor whose bytes are a recognisable pattern (never zeros, so misplaced data shows).
Tensor patterned(DType dtype, Shape shape, int seed) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  auto* bytes = t.data<uint8_t>();
  for (std::size_t i = 0; i < t.nbytes(); ++i)
    bytes[i] = static_cast<uint8_t>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> tensors;
  int seed = 0;
  for (const auto& t : kDTypeTraits)
    tensors.emplace_back(cat("t.", t.safetensors_name), patterned(t.dtype, {3, 5}, ++seed));
  const auto path = dir / "all.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}});

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    const Tensor got = file->get(name);
    EXPECT_EQ(got.dtype(), expected.dtype()) << name;
    EXPECT_EQ(got.shape(), expected.shape()) << name;
    EXPECT_EQ(got.device(), Device::kCpu);
    EXPECT_TRUE(same_bytes(got, expected)) << name;
  }
}

TEST(Safetensors, WritesDataInGivenOrderAndPadsHeader) {
  TempDir dir;
  const auto path = dir / "order.safetensors";
  write_safetensors(path,
                    {{"z", patterned(DType::kF32, {2}, 1)}, {"a", patterned(DType::kU8, {3}, 2)}});
  const std::string bytes = test::read_file(path);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = header_size << 8 | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_size + 8 + 3);  // no padding between tensors
  const std::string header = bytes.substr(8, header_size);
  const std::size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);  // padded with fewer than 8 spaces

  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->info("z").begin, 0u);
  EXPECT_EQ(file->info("z").end, 8u);
  EXPECT_EQ(file->info("a").begin, 8u);
  EXPECT_EQ(file->info("a").end, 11u);
  EXPECT_TRUE(file->metadata().empty());
}

TEST(Safetensors, ScalarAndEmptyTensors) {
  TempDir dir;
  const auto path = dir / "edge.safetensors";
  const Tensor scalar = patterned(DType::kF32, {}, 3);
  const Tensor empty = Tensor::zeros(DType::kBF16, {0, 4});
  write_safetensors(
      path, {{"scalar", scalar}, {"empty", empty}, {"after", patterned(DType::kI8, {2}, 4)}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->get("scalar").shape(), Shape{});
  EXPECT_TRUE(same_bytes(file->get("scalar"), scalar));
  EXPECT_EQ(file->get("empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(file->get("empty").nbytes(), 0u);
  EXPECT_EQ(file->get("after").shape(), Shape{2});
}

TEST(Safetensors, ViewsOutliveTheFile) {
  TempDir dir;
  const auto path = dir / "view.safetensors";
  const Tensor expected = patterned(DType::kI64, {4, 2}, 5);
  write_safetensors(path, {{"w", expected}});
  Tensor view = SafetensorsFile::open(path)->get("w");  // the file object is gone after this line
  EXPECT_TRUE(same_bytes(view, expected));
}

// The layout the Python `safetensors` package writes for {"a": float32 [1.0, 2.0]}, by hand.
TEST(Safetensors, ReadsReferenceLayout) {
  TempDir dir;
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const float values[2] = {1.0f, 2.0f};
  test::write_file(dir / "model.safetensors",
                   test::image(header, std::string_view(reinterpret_cast<const char*>(values), 8)));
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  const Tensor a = checkpoint.get("a");
  EXPECT_EQ(a.dtype(), DType::kF32);
  EXPECT_EQ(a.data<float>()[0], 1.0f);
  EXPECT_EQ(a.data<float>()[1], 2.0f);
}

TEST(Safetensors, AcceptsGapsAndTrailingBytes) {
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
      R"("e":{"dtype":"F32","shape":[0],"data_offsets":[1,1]}})";
  const auto layout = parse_safetensors_header_full(header, 12, "gaps");
  ASSERT_EQ(layout.tensors.size(), 3u);
  EXPECT_EQ(layout.tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(layout.tensors[2].name, "b");
}

TEST(Safetensors, WriteReplacesExistingFileAndLeavesNoTemp) {
  TempDir dir;
  const auto path = dir / "w.safetensors";
  write_safetensors(path, {{"x", patterned(DType::kU8, {4}, 1)}});
  write_safetensors(path, {{"y", patterned(DType::kU8, {2}, 2)}});
  EXPECT_TRUE(SafetensorsFile::open(path)->contains("y"));
  EXPECT_FALSE(SafetensorsFile::open(path)->contains("x"));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Safetensors, WriteFailuresKeepTheOldFile) {
  TempDir dir;
  const auto path = dir / "keep.safetensors";
  write_safetensors(path, {{"x", patterned(DType::kU8, {4}, 1)}});
  const std::string before = test::read_file(path);
  const Tensor t = patterned(DType::kU8, {1}, 2);
  EXPECT_ERROR(write_safetensors(path, {{"a", t}, {"a", t}}), "keep.safetensors", "\"a\"", "twice");
  EXPECT_ERROR(write_safetensors(path, {{"__metadata__", t}}), "__metadata__");
  EXPECT_ERROR(write_safetensors(path, {{"u", Tensor()}}), "\"u\"", "no data");
  int fake = 0;
  const Tensor on_gpu = Tensor::wrap(&fake, DType::kU8, {1}, Device::kCuda, nullptr);
  EXPECT_ERROR(write_safetensors(path, {{"g", on_gpu}}), "\"g\"", "cuda");
  EXPECT_ERROR(write_safetensors(path, {{"bad\xff", t}}), "UTF-8");
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_ERROR(write_safetensors(dir / "no-such-dir" / "x.safetensors", {{"a", t}}), "no-such-dir");
}

// ---- model directories ----

std::string index_json(const std::string& weight_map) {
  return R"({"metadata":{"total_size":0},"weight_map":)" + weight_map + "}";
}

TEST(Checkpoint, ShardedViaIndex) {
  TempDir dir;
  const Tensor a = patterned(DType::kBF16, {4, 4}, 1), b = patterned(DType::kF32, {3}, 2),
               c = patterned(DType::kI32, {2, 2}, 3);
  write_safetensors(dir / "model-00001-of-00002.safetensors", {{"layers.0.w", a}, {"embed", b}});
  write_safetensors(dir / "model-00002-of-00002.safetensors", {{"layers.1.w", c}});
  test::write_file(dir / "model.safetensors.index.json",
                   index_json(R"({"embed":"model-00001-of-00002.safetensors",)"
                              R"("layers.0.w":"model-00001-of-00002.safetensors",)"
                              R"("layers.1.w":"model-00002-of-00002.safetensors"})"));
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"embed", "layers.0.w", "layers.1.w"}));
  EXPECT_TRUE(checkpoint.contains("layers.1.w"));
  EXPECT_FALSE(checkpoint.contains("layers.2.w"));
  EXPECT_TRUE(same_bytes(checkpoint.get("layers.0.w"), a));
  EXPECT_TRUE(same_bytes(checkpoint.get("embed"), b));
  EXPECT_TRUE(same_bytes(checkpoint.get("layers.1.w"), c));
  EXPECT_EQ(checkpoint.info("layers.1.w").dtype, DType::kI32);
}

TEST(Checkpoint, BareShardsWithoutIndex) {
  TempDir dir;
  write_safetensors(dir / "b.safetensors", {{"y", patterned(DType::kU8, {1}, 1)}});
  write_safetensors(dir / "a.safetensors", {{"x", patterned(DType::kU8, {1}, 2)}});
  test::write_file(dir / "notes.txt", "not a shard");
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), (std::vector<std::string>{"x", "y"}));
}

TEST(Checkpoint, SingleFileWinsOverOthers) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"x", patterned(DType::kU8, {1}, 1)}});
  write_safetensors(dir / "other.safetensors", {{"x", patterned(DType::kU8, {1}, 2)}});
  EXPECT_EQ(Checkpoint::open(dir.path()).names(), std::vector<std::string>{"x"});
}

TEST(Checkpoint, MissingTensor) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {{"x", patterned(DType::kU8, {1}, 1)}});
  const Checkpoint checkpoint = Checkpoint::open(dir.path());
  const std::string message = test::error_of([&] { checkpoint.get("lm_head.weight"); });
  EXPECT_EQ(message, dir.path().string() + ": tensor \"lm_head.weight\" not found in checkpoint");
  EXPECT_ERROR(checkpoint.info("nope"), "\"nope\"", "not found in checkpoint");
  const auto file = SafetensorsFile::open(dir / "model.safetensors");
  EXPECT_ERROR(file->get("nope"), "model.safetensors", "\"nope\"", "not found");
}

TEST(Checkpoint, DirectoryErrors) {
  TempDir dir;
  EXPECT_ERROR(Checkpoint::open(dir / "absent"), "model directory ", "absent", "does not exist");
  test::write_file(dir / "file", "x");
  EXPECT_ERROR(Checkpoint::open(dir / "file"), "is not a directory");
  EXPECT_ERROR(Checkpoint::open(dir.path()), dir.path().string(), "no .safetensors files found");
}

TEST(Checkpoint, IndexErrors) {
  TempDir dir;
  write_safetensors(dir / "s1.safetensors", {{"x", patterned(DType::kU8, {1}, 1)}});
  write_safetensors(dir / "s2.safetensors", {{"y", patterned(DType::kU8, {1}, 2)}});
  const auto index = dir / "model.safetensors.index.json";
  const auto open_with = [&](const std::string& text) {
    test::write_file(index, text);
    return Checkpoint::open(dir.path());
  };
  EXPECT_ERROR(open_with("{oops"), "model.safetensors.index.json", "not valid JSON");
  EXPECT_ERROR(open_with("[]"), "index.json", "must be a JSON object");
  EXPECT_ERROR(open_with("{}"), "index.json", "missing \"weight_map\"");
  EXPECT_ERROR(open_with(R"({"weight_map":[]})"), "\"weight_map\" must be an object");
  EXPECT_ERROR(open_with(index_json(R"({"x":1})")), "weight_map[\"x\"]", "got number");
  EXPECT_ERROR(open_with(index_json(R"({"x":"../s1.safetensors"})")), "\"x\"", "not a file name");
  EXPECT_ERROR(open_with(index_json(R"({"x":"s1.safetensors","y":"s3.safetensors"})")),
               "shard \"s3.safetensors\"", "\"y\"", "not found");
  EXPECT_ERROR(open_with(index_json(R"({"x":"s1.safetensors","y":"s1.safetensors"})")),
               "index.json", "tensor \"y\"", "listed in shard \"s1.safetensors\"", "not there");
  write_safetensors(dir / "s2.safetensors", {{"x", patterned(DType::kU8, {1}, 2)}});
  EXPECT_ERROR(open_with(index_json(R"({"x":"s1.safetensors","z":"s2.safetensors"})")),
               "tensor \"x\"", "both", "s1.safetensors", "s2.safetensors");
}

TEST(Checkpoint, BrokenShardIsNamed) {
  TempDir dir;
  write_safetensors(dir / "s1.safetensors", {{"x", patterned(DType::kU8, {1}, 1)}});
  test::write_file(dir / "s2.safetensors", "short");
  test::write_file(dir / "model.safetensors.index.json",
                   index_json(R"({"x":"s1.safetensors","y":"s2.safetensors"})"));
  EXPECT_ERROR(Checkpoint::open(dir.path()), "s2.safetensors", "too short");
}

}  // namespace
}  // namespace nibble
