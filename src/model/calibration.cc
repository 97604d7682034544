// Calibration: the amax-recording Ops wrapper, the prefill driver, and the built-in text sample.
#include "model/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>

#include "core/fp8.h"
#include "model/loader.h"
#include "model/model.h"
#include "quant/fp8_quant.h"

namespace nibble {
namespace {

// Largest |value| of columns [begin, end) of x (rows, cols), read on the CPU.
float column_amax(Ops& ops, const Tensor& x, int64_t begin, int64_t end) {
  const Tensor f = to_f32(ops.download(x));
  const int64_t rows = f.dim(0), cols = f.dim(1);
  float amax = 0.0f;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = begin; k < end; ++k)
      amax = std::max(amax, std::fabs(f.data<float>()[r * cols + k]));
  return amax;
}

// Delegates every op to `inner`; on the way, records the amax of the inputs of the watched linears
// and of the K and V parts written to the cache. model.cc runs a layer's qkv projection right
// before its attention, so attention's keys and values belong to the layer of the last qkv
// projection seen.
class CalibratingOps final : public Ops {
 public:
  explicit CalibratingOps(Ops& inner) : inner_(inner) {}

  // Records into `layers` from now on; `weights` are the model's (their addresses identify the
  // linears).
  void watch(const ModelWeights& weights, std::vector<LayerCalibration>& layers) {
    layers_ = &layers;
    layers.assign(weights.layers.size(), {});
    for (std::size_t i = 0; i < weights.layers.size(); ++i) {
      points_[&weights.layers[i].attention.qkv_proj] = {static_cast<int64_t>(i), Point::kQkvInput};
      points_[&weights.layers[i].attention.o_proj] = {static_cast<int64_t>(i), Point::kOInput};
    }
  }

  Device device() const override { return inner_.device(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  Tensor empty(DType dtype, Shape shape) override { return inner_.empty(dtype, std::move(shape)); }
  Tensor upload(const Tensor& host) override { return inner_.upload(host); }
  Tensor download(const Tensor& device_tensor) override { return inner_.download(device_tensor); }
  MemoryInfo memory_info() const override { return inner_.memory_info(); }
  MoeWeights prepare_moe(const MoeWeights& host) override { return inner_.prepare_moe(host); }

  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override {
    inner_.embedding(ids, table, out);
  }
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    inner_.rms_norm(x, weight, eps, out);
  }
  void add(Tensor& x, const Tensor& y) override { inner_.add(x, y); }
  void scale(Tensor& x, float factor) override { inner_.scale(x, factor); }
  void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) override {
    inner_.logits(x, rows, w, out);
  }
  void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params,
            double theta) override {
    inner_.rope(qkv, positions, params, theta);
  }
  void moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) override {
    inner_.moe(x, w, params, out);
  }

  void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) override {
    if (const auto it = points_.find(&w); it != points_.end() && layers_ != nullptr) {
      LayerCalibration& layer = (*layers_)[it->second.layer];
      const float amax = column_amax(inner_, x, 0, x.dim(1));
      if (it->second.point == Point::kQkvInput) {
        layer.qkv_input_amax = std::max(layer.qkv_input_amax, amax);
        current_layer_ = it->second.layer;
      } else {
        layer.o_input_amax = std::max(layer.o_input_amax, amax);
      }
    }
    inner_.linear(x, w, out, row_group);
  }

  void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                 const ForwardBatch& batch, const AttentionParams& p, Tensor& out) override {
    if (layers_ != nullptr) {
      check(current_layer_ >= 0, "calibration: attention ran before any qkv projection");
      LayerCalibration& layer = (*layers_)[current_layer_];
      const int64_t q = p.num_heads * p.head_dim, kv = p.num_kv_heads * p.head_dim;
      layer.k_amax = std::max(layer.k_amax, column_amax(inner_, qkv, q, q + kv));
      layer.v_amax = std::max(layer.v_amax, column_amax(inner_, qkv, q + kv, q + 2 * kv));
    }
    inner_.attention(qkv, cache, cache_dtype, batch, p, out);
  }

 private:
  enum class Point : uint8_t { kQkvInput, kOInput };
  struct Where {
    int64_t layer;
    Point point;
  };
  Ops& inner_;
  std::vector<LayerCalibration>* layers_ = nullptr;
  std::map<const Linear*, Where> points_;
  int64_t current_layer_ = -1;
};

// One sequence as a single prefill into a fresh cache (slot = position), logits for its last token.
void prefill(Model& model, const std::vector<int32_t>& ids) {
  constexpr int64_t kBlockSize = 16;
  Ops& ops = model.ops();
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t blocks = (n + kBlockSize - 1) / kBlockSize;
  KvCache cache = model.allocate_kv_cache(blocks, kBlockSize, KvCacheDType::kBf16);
  std::vector<int32_t> positions(n), block_ids(blocks);
  std::iota(positions.begin(), positions.end(), 0);
  std::iota(block_ids.begin(), block_ids.end(), 0);
  const ForwardBatch batch{.num_tokens = n,
                           .num_seqs = 1,
                           .token_ids = ops.upload(host_i32(ids, {n})),
                           .positions = ops.upload(host_i32(positions, {n})),
                           .query_start = ops.upload(host_i32({0, static_cast<int32_t>(n)}, {2})),
                           .seq_lens = ops.upload(host_i32({static_cast<int32_t>(n)}, {1})),
                           .block_tables = ops.upload(host_i32(block_ids, {1, blocks})),
                           .slot_mapping = ops.upload(host_i32(positions, {n})),
                           .logit_rows = ops.upload(host_i32({static_cast<int32_t>(n - 1)}, {1})),
                           .max_query_len = n,
                           .max_seq_len = n};
  model.forward(batch, cache);
}

}  // namespace

float static_fp8_scale(float amax) {
  return std::max(amax, kMinActivationAmax) / kFp8E4M3Max;
}

Calibration calibrate(const Checkpoint& checkpoint, const ModelConfig& config, Ops& backend,
                      const std::vector<std::vector<int32_t>>& sequences,
                      const CalibrationProgress& progress) {
  check(!config.quantization_config, checkpoint.dir().string(),
        " is already quantized (quantization_config in config.json): calibration needs its bf16 "
        "weights");
  check(!sequences.empty(), "calibration: no sequences");
  for (const auto& ids : sequences) {
    check(!ids.empty(), "calibration: an empty sequence");
    check(static_cast<int64_t>(ids.size()) <= config.max_position_embeddings,
          "calibration: a sequence of ", ids.size(), " tokens exceeds max_position_embeddings (",
          config.max_position_embeddings, ")");
    for (int32_t id : ids)
      check(id >= 0 && id < config.vocab_size, "calibration: token id ", id,
            " is outside the vocabulary (", config.vocab_size, ")");
  }
  CalibratingOps ops(backend);
  Model model(config, load_weights(checkpoint, config, Quantization::kNone, ops), ops);
  Calibration calibration;
  ops.watch(model.weights(), calibration.layers);
  for (const auto& ids : sequences) {
    prefill(model, ids);
    calibration.num_tokens += static_cast<int64_t>(ids.size());
    ++calibration.num_sequences;
    if (progress) progress(calibration.num_sequences, static_cast<int64_t>(sequences.size()));
  }
  return calibration;
}

std::span<const std::string_view> calibration_texts() {
  // Written for nibble: varied registers so the activations cover more than one kind of text.
  static constexpr std::array<std::string_view, 8> kTexts{
      "The river had been rising for three days before anyone in the village thought to move the "
      "grain. "
      "By the time the council met, water stood ankle-deep in the lower streets, and the miller's "
      "children "
      "were ferrying sacks to the church on a door they had taken off its hinges. Nobody drowned. "
      "Years "
      "later the old people still argued about whose fault the delay had been, but they agreed on "
      "one thing: "
      "the door floated better than the boat.",

      "\"Are you sure this is the right platform?\" she asked, looking at the board.\n"
      "\"Platform nine, the 7:45 to Leeds. It says so right there.\"\n"
      "\"It says the 7:54.\"\n"
      "He squinted, then laughed. \"Then we have nine more minutes and I am buying coffee.\"\n"
      "\"Two sugars,\" she called after him, \"and don't let them put cinnamon on it again!\"",

      "To replace a bicycle inner tube: 1. Shift to the smallest rear cog and open the brake. 2. "
      "Release the "
      "quick-release lever and remove the wheel. 3. Push the valve up, then work two tyre levers "
      "under the "
      "bead about 10 cm apart. 4. Pull the old tube out and run your fingers carefully around the "
      "inside of "
      "the tyre to find whatever caused the puncture. 5. Inflate the new tube slightly, fit it, "
      "and seat the "
      "bead by hand. Pump to the pressure printed on the sidewall (usually 80-110 psi for road "
      "tyres).",

      "def moving_average(values, window):\n"
      "    \"\"\"Return the mean of each run of `window` consecutive values.\"\"\"\n"
      "    if window <= 0:\n"
      "        raise ValueError(f\"window must be positive, got {window}\")\n"
      "    total = sum(values[:window])\n"
      "    out = [total / window]\n"
      "    for i in range(window, len(values)):\n"
      "        total += values[i] - values[i - window]\n"
      "        out.append(total / window)\n"
      "    return out\n",

      "Quarterly results: revenue grew 12.4% year over year to $3.82 billion, while operating "
      "costs rose "
      "only 7.1%. Gross margin reached 41.9%, up from 39.6% a year ago. The company repurchased "
      "2.3 million "
      "shares at an average price of $57.20 and raised its full-year guidance to between $15.1 and "
      "$15.4 "
      "billion. Inventory fell for the fourth consecutive quarter, to 63 days of supply.",

      "Photosynthesis takes place mainly in the chloroplasts of leaf cells. Light energy splits "
      "water "
      "molecules, releasing oxygen, and the energy captured is stored in ATP and NADPH. In the "
      "Calvin cycle "
      "these carriers drive the fixation of carbon dioxide into three-carbon sugars, which the "
      "plant then "
      "builds into glucose, sucrose and starch. Roughly six molecules of CO2 are needed for each "
      "molecule "
      "of glucose produced.",

      "Q: If a train leaves at 14:20 and the journey takes 2 hours and 55 minutes, when does it "
      "arrive?\n"
      "A: 14:20 plus 2 hours is 16:20; plus 55 minutes is 17:15. The train arrives at 17:15.\n"
      "Q: What is 15% of 240?\n"
      "A: 10% of 240 is 24 and 5% is 12, so 15% is 36.",

      "Il pleuvait depuis le matin. Sur la place du marché, les marchands avaient tendu des bâches "
      "et "
      "vendaient quand même leurs pommes, leurs fromages et leurs fleurs. À Tokyo, 朝はとても早い。"
      "Мы встретились у вокзала в восемь часов. Wir sehen uns morgen um halb neun. ¿Dónde está la "
      "biblioteca? The café served crème brûlée for €4,50."};
  return kTexts;
}

}  // namespace nibble
