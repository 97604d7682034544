// Helpers for the pre-quantized checkpoint tests: write a tiny fixture's Quark checkpoint with
// `calibrate` + `write_quark_checkpoint` (what `nibble quantize` runs), copy a checkpoint with some
// tensors or config fields changed, load it, and compare tensors byte for byte.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fixture_test_util.h"
#include "model/calibration.h"
#include "model/quark_loader.h"
#include "model/quark_writer.h"

namespace nibble::test {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary directory, removed with its contents at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = fs::temp_directory_path() / cat("nibble-", tag, "-", ::getpid(), "-", counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The reference prompt and two fixed id sequences (the CLI uses the built-in text; any ids do
// here).
inline std::vector<std::vector<int32_t>> calibration_ids(const std::string& reference_json,
                                                         int64_t vocab) {
  std::vector<std::vector<int32_t>> sequences{
      read_json(reference_json)["ids"].get<std::vector<int32_t>>()};
  for (int32_t seed : {7, 11}) {
    std::vector<int32_t> ids{1};
    for (int32_t i = 1; i < 48; ++i)
      ids.push_back(static_cast<int32_t>((i * 131 + seed * 17) % vocab));
    sequences.push_back(ids);
  }
  return sequences;
}

// Calibrates the bf16 fixture `model` and writes its checkpoint into `out` (a new path).
inline Calibration write_quantized(const std::string& model, const std::string& reference_json,
                                   const fs::path& out, WeightFormat expert_format,
                                   int64_t max_shard_bytes = 5'000'000'000) {
  CpuOps cpu;
  const ModelConfig config = load_model_config(model);
  const Calibration calibration = calibrate(Checkpoint::open(model), config, cpu,
                                            calibration_ids(reference_json, config.vocab_size));
  write_quark_checkpoint(model, out, calibration,
                         {.expert_format = expert_format, .max_shard_bytes = max_shard_bytes});
  return calibration;
}

using TensorMap = std::map<std::string, Tensor>;

inline Tensor owned(const Tensor& t) {
  Tensor out = Tensor::zeros(t.dtype(), t.shape());
  if (t.nbytes() > 0) std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

inline TensorMap read_all(const fs::path& dir) {
  const Checkpoint checkpoint = Checkpoint::open(dir);
  TensorMap tensors;
  for (const std::string& name : checkpoint.names()) tensors[name] = owned(checkpoint.get(name));
  return tensors;
}

inline Tensor f32_scalar(float value) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = value;
  return t;
}

// A copy of the checkpoint in `from` (one shard, config.json) with `change` applied to its tensors
// and `change_config` to its config.json, written into the new directory `to`.
inline void write_variant(const fs::path& from, const fs::path& to,
                          const std::function<void(TensorMap&)>& change,
                          const std::function<void(nlohmann::json&)>& change_config = {}) {
  TensorMap tensors = read_all(from);
  if (change) change(tensors);
  nlohmann::json config = read_json((from / "config.json").string());
  if (change_config) change_config(config);
  fs::create_directories(to);
  std::vector<std::pair<std::string, Tensor>> list(tensors.begin(), tensors.end());
  std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) {
    return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
  });
  write_safetensors(to / "model.safetensors", list);
  std::ofstream(to / "config.json") << config.dump(2);
}

struct LoadedQuark {
  CpuOps ops;
  ModelConfig config;
  ModelWeights weights;
};

// The pre-quantized checkpoint in `dir` through the quark loader.
inline std::unique_ptr<LoadedQuark> load_quark(const fs::path& dir,
                                               StaticScales scales = StaticScales::kUse) {
  auto l = std::make_unique<LoadedQuark>();
  l->config = load_model_config(dir);
  l->weights = load_quark_weights(Checkpoint::open(dir), l->config, l->ops, nullptr, scales);
  return l;
}

inline std::unique_ptr<Loaded> as_model(const fs::path& dir, StaticScales scales) {
  auto l = std::make_unique<Loaded>();
  ModelConfig c = load_model_config(dir);
  ModelWeights w = load_quark_weights(Checkpoint::open(dir), c, l->ops, nullptr, scales);
  l->model = std::make_unique<Model>(std::move(c), std::move(w), l->ops);
  return l;
}

inline ::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b,
                                             const std::string& what) {
  if (a.defined() != b.defined())
    return ::testing::AssertionFailure() << what << ": one side is undefined";
  if (!a.defined()) return ::testing::AssertionSuccess();
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return ::testing::AssertionFailure() << what << ": " << a.describe() << " vs " << b.describe();
  if (std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << what << ": contents differ";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult same_linear(const Linear& a, const Linear& b,
                                              const std::string& what) {
  if (a.format != b.format || a.out_features != b.out_features || a.in_features != b.in_features)
    return ::testing::AssertionFailure() << what << ": format or shape differ";
  if (auto r = same_bytes(a.weight, b.weight, what + " weight"); !r) return r;
  return same_bytes(a.scale, b.scale, what + " scale");
}

// The message of the Error `load` throws ("" if it does not throw).
inline std::string error_of(const std::function<void()>& load) {
  try {
    load();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace nibble::test
