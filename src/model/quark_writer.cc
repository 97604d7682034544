// nibble quantize's writer: plan shards from the source shapes, quantize tensor by tensor, write
// shards, index, config and the small files into a temporary directory, then rename it into place.
#include "model/quark_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fp8.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "model/quark_config.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

enum class Kind : uint8_t { kExpert, kAttention, kCopy };

// One source tensor and what becomes of it.
struct Job {
  std::string name;
  Kind kind = Kind::kCopy;
  int64_t layer = -1;  // kAttention
  char proj = 0;       // kAttention: 'q', 'k', 'v' or 'o'
  int64_t bytes = 0;   // written
};

Tensor scalar(float value) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = value;
  return t;
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

Job plan(const Checkpoint& checkpoint, const std::string& name, WeightFormat expert_format,
         int64_t num_layers) {
  static const std::regex kExpert(
      R"(model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w[123]\.weight)");
  static const std::regex kAttention(R"(model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight)");
  const TensorInfo& info = checkpoint.info(name);
  Job job{.name = name,
          .kind = Kind::kCopy,
          .layer = -1,
          .proj = 0,
          .bytes = static_cast<int64_t>(info.end - info.begin)};
  std::smatch match;
  if (std::regex_match(name, kExpert)) {
    job.kind = Kind::kExpert;
  } else if (std::regex_match(name, match, kAttention)) {
    job.kind = Kind::kAttention;
    job.layer = std::stoll(match[1].str());
    job.proj = match[2].str()[0];
    check(job.layer < num_layers, checkpoint.dir().string(), ": tensor \"", name,
          "\" belongs to no layer (", num_layers, " layers)");
  } else {
    return job;
  }
  const std::string where = cat(checkpoint.dir().string(), ": tensor \"", name, "\"");
  check(is_float(info.dtype), where, " has dtype ", dtype_name(info.dtype),
        "; nibble quantize reads BF16, F16 or F32 weights");
  check(info.shape.size() == 2, where, " has shape ", shape_str(info.shape), ", expected a matrix");
  const int64_t rows = info.shape[0], cols = info.shape[1];
  if (job.kind == Kind::kExpert && expert_format == WeightFormat::kInt4) {
    check(cols % kInt4PerWord == 0, where, " has ", cols,
          " columns: INT4 packing needs a multiple of 8");
    job.bytes = rows * cols / 2 + 4 + 4 * rows;  // codes, weight_scale, weight_scale1
  } else {
    job.bytes = rows * cols + 4 + (job.kind == Kind::kAttention ? 4 : 0) +
                (job.proj == 'k' || job.proj == 'v' ? 4 : 0);
  }
  return job;
}

// The tensors one job writes.
std::vector<std::pair<std::string, Tensor>> run(const Checkpoint& checkpoint, const Job& job,
                                                WeightFormat expert_format,
                                                const Calibration& calibration) {
  if (job.kind == Kind::kCopy) return {{job.name, checkpoint.get(job.name)}};
  const std::string base = job.name.substr(0, job.name.size() - std::string(".weight").size());
  const Tensor source = checkpoint.get(job.name);
  std::vector<std::pair<std::string, Tensor>> out;
  if (job.kind == Kind::kExpert && expert_format == WeightFormat::kInt4) {
    Int4Weight q = quantize_int4(source);
    const float tensor_scale = int4_tensor_scale(q.scale);
    for (int64_t o = 0; o < q.scale.numel(); ++o)
      q.scale.data<float>()[o] /= tensor_scale;  // exact
    out = {{job.name, q.packed},
           {base + ".weight_scale", scalar(tensor_scale)},
           {base + ".weight_scale1", q.scale}};
    return out;
  }
  const Fp8Weight q = quantize_fp8_per_tensor(source);
  out = {{job.name, q.weight}, {base + ".weight_scale", scalar(q.scale)}};
  if (job.kind == Kind::kAttention) {
    const LayerCalibration& layer = calibration.layers.at(job.layer);
    const float input_amax = job.proj == 'o' ? layer.o_input_amax : layer.qkv_input_amax;
    out.emplace_back(base + ".input_scale", scalar(static_fp8_scale(input_amax)));
    if (job.proj == 'k')
      out.emplace_back(base + ".output_scale", scalar(static_fp8_scale(layer.k_amax)));
    if (job.proj == 'v')
      out.emplace_back(base + ".output_scale", scalar(static_fp8_scale(layer.v_amax)));
  }
  return out;
}

// Files beside the weights worth keeping (tokenizer, generation config, chat template, license...):
// everything but config.json and the weights themselves.
bool is_weight_file(const fs::path& path) {
  const std::string name = path.filename().string();
  if (name == "config.json" || name.ends_with(".safetensors.index.json") ||
      name.ends_with(".bin.index.json"))
    return true;
  for (const char* ext :
       {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".msgpack", ".h5", ".gguf"})
    if (name.ends_with(ext)) return true;
  return false;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  check(out.good(), path.string(), ": cannot write");
}

// The checkpoint into `dir` (a fresh directory).
QuarkWriteSummary write_into(const fs::path& model_dir, const fs::path& dir,
                             const Calibration& calibration, const QuarkWriteOptions& options,
                             const WriteProgress& progress) {
  const fs::path config_path = model_dir / "config.json";
  std::ifstream config_file(config_path, std::ios::binary);
  check(config_file.good(), config_path.string(), ": cannot open");
  nlohmann::ordered_json config_json;
  try {
    config_json = nlohmann::ordered_json::parse(config_file);
  } catch (const nlohmann::json::exception& e) {
    fail(config_path.string(), ": ", e.what());
  }
  const ModelConfig config = load_model_config(model_dir);
  check(!config.quantization_config, model_dir.string(),
        " is already quantized (quantization_config in config.json); nibble quantize needs a bf16 "
        "checkpoint");
  check(static_cast<int64_t>(calibration.layers.size()) == config.num_hidden_layers,
        "the calibration has ", calibration.layers.size(), " layers, the model ",
        config.num_hidden_layers);

  const Checkpoint checkpoint = Checkpoint::open(model_dir);
  std::vector<Job> jobs;
  for (const std::string& name : checkpoint.names())
    jobs.push_back(plan(checkpoint, name, options.expert_format, config.num_hidden_layers));
  // Shards in name order; a tensor and its scales stay together.
  std::vector<std::vector<const Job*>> shards(1);
  int64_t shard_bytes = 0;
  for (const Job& job : jobs) {
    if (!shards.back().empty() && shard_bytes + job.bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&job);
    shard_bytes += job.bytes;
  }

  QuarkWriteSummary summary{
      .tensors = 0, .shards = static_cast<int64_t>(shards.size()), .bytes = 0};
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t done = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string file_name = shards.size() == 1 ? "model.safetensors" : file;
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const Job* job : shards[s]) {
      for (auto& t : run(checkpoint, *job, options.expert_format, calibration))
        tensors.push_back(std::move(t));
      if (progress) progress(++done, static_cast<int64_t>(jobs.size()));
    }
    // Wider elements first, so every tensor starts aligned to its element size in the file.
    std::stable_sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
      return dtype_size(a.second.dtype()) > dtype_size(b.second.dtype());
    });
    for (const auto& [name, tensor] : tensors) {
      weight_map[name] = file_name;
      summary.bytes += static_cast<int64_t>(tensor.nbytes());
    }
    summary.tensors += static_cast<int64_t>(tensors.size());
    write_safetensors(dir / file_name, tensors, {{"format", "pt"}});
  }
  if (shards.size() > 1) {
    const nlohmann::json index{{"metadata", {{"total_size", summary.bytes}}},
                               {"weight_map", weight_map}};
    write_text(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  config_json["quantization_config"] =
      make_quark_config(options.expert_format, config.num_hidden_layers);
  write_text(dir / "config.json", config_json.dump(2) + "\n");
  for (const fs::directory_entry& entry : fs::directory_iterator(model_dir))
    if (entry.is_regular_file() && !is_weight_file(entry.path()))
      fs::copy_file(entry.path(), dir / entry.path().filename());
  return summary;
}

}  // namespace

float int4_tensor_scale(const Tensor& row_scale) {
  float max_scale = 0.0f;
  for (int64_t o = 0; o < row_scale.numel(); ++o)
    max_scale = std::max(max_scale, row_scale.data<float>()[o]);
  int exponent = 0;
  std::frexp(max_scale * static_cast<float>(kInt4Max) / kFp8E4M3Max,
             &exponent);  // value ≤ 2^exponent
  return std::ldexp(1.0f, exponent);
}

QuarkWriteSummary write_quark_checkpoint(const fs::path& model_dir, const fs::path& output_dir,
                                         const Calibration& calibration,
                                         const QuarkWriteOptions& options,
                                         const WriteProgress& progress) {
  check(options.expert_format == WeightFormat::kInt4 || options.expert_format == WeightFormat::kFp8,
        "nibble quantize: experts must be INT4 or FP8");
  check(options.max_shard_bytes > 0, "nibble quantize: the shard size must be positive");
  fs::path out = fs::absolute(output_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  std::error_code error;
  if (fs::exists(out)) {
    check(fs::is_directory(out) && fs::is_empty(out), "--output ", out.string(),
          " exists and is not an empty directory");
    check(!fs::equivalent(out, model_dir, error), "--output is the model directory");
  }
  const fs::path temp = out.parent_path() / cat(out.filename().string(), ".partial-", ::getpid());
  check(fs::create_directories(temp, error), "cannot create ", temp.string(), ": ",
        error.message());
  try {
    const QuarkWriteSummary summary = write_into(model_dir, temp, calibration, options, progress);
    if (fs::exists(out)) fs::remove(out);  // the empty directory it replaces
    fs::rename(temp, out);
    return summary;
  } catch (...) {
    fs::remove_all(temp, error);
    throw;
  }
}

}  // namespace nibble
