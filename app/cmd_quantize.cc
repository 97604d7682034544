// `nibble quantize`: a bf16 checkpoint to a pre-quantized one in AMD Quark's W4A8KV8 format (or
// FP8): calibrate the static activation and KV-cache scales on the built-in text sample with the
// bf16 model on the CPU backend, then quantize and write (src/model/quark_writer.h). Progress on
// stderr.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "cpu/cpu_ops.h"
#include "model/calibration.h"
#include "model/quark_writer.h"
#include "tokenizer/tokenizer.h"

namespace nibble {
namespace {

constexpr int64_t kMaxCalibrationTokens = 512;  // per sequence

// "5GB", "500MB", "64KiB", "1000" -> bytes (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024).
int64_t parse_size(const std::string& text) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char ch) { return std::toupper(ch); });
  double factor = 0;
  for (const auto& [name, f] : {std::pair{"", 1.0},
                                {"B", 1.0},
                                {"KB", 1e3},
                                {"MB", 1e6},
                                {"GB", 1e9},
                                {"KIB", 1024.0},
                                {"MIB", 1048576.0},
                                {"GIB", 1073741824.0}})
    if (unit == name) factor = f;
  check(used > 0 && factor > 0 && value > 0 && value * factor < 9e18, "--max-shard-size ", text,
        " is not a size (e.g. 5GB, 500MB, 2GiB)");
  return static_cast<int64_t>(value * factor);
}

// A live counter on a terminal; every tenth of the way otherwise, so logs stay short.
void show(const char* what, const char* unit, int64_t done, int64_t total) {
  static const bool tty = isatty(STDERR_FILENO) != 0;
  if (tty)
    std::cerr << "\r" << what << ": " << done << "/" << total << " " << unit
              << (done == total ? "\n" : "") << std::flush;
  else if (done == total || (done * 10 / total) != ((done - 1) * 10 / total))
    std::cerr << what << ": " << done << "/" << total << " " << unit << "\n";
}

// The built-in texts as token sequences (BOS first), cut to what the model and a quick run allow.
std::vector<std::vector<int32_t>> calibration_sequences(const Tokenizer& tokenizer,
                                                        int64_t max_len) {
  std::vector<std::vector<int32_t>> sequences;
  for (const std::string_view text : calibration_texts()) {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    for (std::size_t begin = 0; begin < ids.size(); begin += static_cast<std::size_t>(max_len)) {
      const std::size_t end = std::min(ids.size(), begin + static_cast<std::size_t>(max_len));
      sequences.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(begin),
                             ids.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
  return sequences;
}

}  // namespace

int run_quantize(const Commands& c) {
  const QuantizeOptions& q = c.quantize_options;
  const std::filesystem::path model_dir = c.model.model_path;
  check(std::filesystem::is_directory(model_dir), "model directory ", model_dir.string(),
        " does not exist");
  QuarkWriteOptions options{.expert_format = WeightFormat::kInt4,
                            .max_shard_bytes = parse_size(q.max_shard_size)};
  if (q.quantization == "fp8")
    options.expert_format = WeightFormat::kFp8;
  else
    check(q.quantization == "quark_int4fp8_moe", "nibble quantize --quantization ", q.quantization,
          " is not supported (quark_int4fp8_moe, fp8)");
  const ModelConfig config = load_model_config(model_dir);
  check(!config.quantization_config, model_dir.string(),
        " is already quantized (quantization_config in config.json); nibble quantize needs a bf16 "
        "checkpoint");
  std::error_code error;
  check(!std::filesystem::exists(q.output, error) ||
            (std::filesystem::is_directory(q.output, error) &&
             std::filesystem::is_empty(q.output, error)),
        "--output ", q.output, " exists and is not an empty directory");

  const auto start = std::chrono::steady_clock::now();
  const Tokenizer tokenizer = Tokenizer::load(model_dir);
  const auto sequences = calibration_sequences(
      tokenizer, std::min(config.max_position_embeddings, kMaxCalibrationTokens));
  CpuOps cpu;
  std::cerr << "calibrating static scales with the bf16 model on the CPU backend\n";
  const Calibration calibration =
      calibrate(Checkpoint::open(model_dir), config, cpu, sequences,
                [](int64_t done, int64_t total) { show("calibrating", "sequences", done, total); });
  const QuarkWriteSummary summary = write_quark_checkpoint(
      model_dir, q.output, calibration, options,
      [](int64_t done, int64_t total) { show("quantizing", "tensors", done, total); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "wrote " << q.output << " (" << q.quantization << "): " << summary.tensors
            << " tensors, " << static_cast<double>(summary.bytes) / 1e6 << " MB in "
            << summary.shards << " shard" << (summary.shards == 1 ? "" : "s") << "; calibrated on "
            << calibration.num_tokens << " tokens (" << calibration.num_sequences
            << " sequences) in " << seconds << " s\n";
  return 0;
}

}  // namespace nibble
