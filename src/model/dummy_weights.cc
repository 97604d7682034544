// Dummy weights: lookup tables of quantiles per target format, filled from a counter-based random
// stream by all cores, assembled into the loader's layouts (see dummy_weights.h for the numbers).
#include "model/dummy_weights.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/fp8.h"
#include "model/memory_plan.h"
#include "quant/int4.h"

namespace nibble {
namespace {

constexpr int64_t kTableSize = 1 << 16;  // one 16-bit uniform per element
constexpr float kNormStd = 0.05f;
constexpr float kInt4RowMaxSigmas = 4.0f;  // a row's max |w| in σ, mapped to code 7

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// Word j of stream `key`; element e of a tensor uses the 16 bits e % 4 of word e / 4.
uint64_t word(uint64_t key, uint64_t j) {
  return mix64(key + (j + 1) * kGamma);
}
double uniform(uint64_t key, uint64_t j) {
  return static_cast<double>(word(key, j) >> 11) * 0x1.0p-53;
}

// Φ⁻¹((i + 0.5) / 65536): the standard normal's quantiles, by bisection on erfc (once, ~0.1 s).
const std::vector<float>& normal_quantiles() {
  static const std::vector<float> table = [] {
    std::vector<float> q(kTableSize);
    for (int64_t i = 0; i < kTableSize / 2; ++i) {
      const double p = (static_cast<double>(i) + 0.5) / kTableSize;  // < 0.5: x < 0
      double lo = -10.0, hi = 0.0;
      for (int it = 0; it < 60; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
      }
      q[i] = static_cast<float>(0.5 * (lo + hi));
      q[kTableSize - 1 - i] = -q[i];
    }
    return q;
  }();
  return table;
}

// Runs fn(begin, end) over [0, n) in chunks of `align` units on every core.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t align, Fn&& fn) {
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t workers = std::clamp<int64_t>(n / (int64_t{1} << 18), 1, hw);
  if (workers == 1) return fn(int64_t{0}, n);
  const int64_t chunk = (n / workers + align - 1) / align * align;
  std::vector<std::thread> threads;
  for (int64_t begin = 0; begin < n; begin += chunk)
    threads.emplace_back([&fn, begin, end = std::min(n, begin + chunk)] { fn(begin, end); });
  for (std::thread& t : threads) t.join();
}

// A host tensor left uninitialized (every element is written by the fillers), so the pages are
// first touched by the filling threads.
Tensor host_empty(DType dtype, Shape shape) {
  const std::size_t bytes = Tensor::wrap(nullptr, dtype, shape, Device::kCpu, nullptr).nbytes();
  void* p = std::aligned_alloc(64, std::max<std::size_t>(64, (bytes + 63) / 64 * 64));
  check(p != nullptr, "dummy weights: out of host memory allocating ", bytes, " bytes");
  return Tensor::wrap(p, dtype, std::move(shape), Device::kCpu,
                      std::shared_ptr<void>(p, std::free));
}

// Element e of `out` = table[16-bit uniform e of stream `key`], for any 1- or 2-byte element type.
template <typename T>
void fill_from_table(T* out, int64_t n, uint64_t key, const std::vector<T>& table) {
  parallel_chunks(n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; e += 4) {
      const uint64_t w = word(key, static_cast<uint64_t>(e / 4));
      for (int64_t lane = 0; lane < 4 && e + lane < end; ++lane)
        out[e + lane] = table[(w >> (16 * lane)) & 0xFFFF];
    }
  });
}

// INT4 codes packed in the on-disk reorder order (src/quant/int4.h): word w holds elements
// 8w..8w+7, nibble i holding element kInt4PackOrder[i].
void fill_int4(int32_t* words, int64_t n_words, uint64_t key, const std::vector<int8_t>& codes) {
  parallel_chunks(n_words, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      const uint64_t a = word(key, static_cast<uint64_t>(2 * w)),
                     b = word(key, static_cast<uint64_t>(2 * w + 1));
      std::array<int, 8> element{};
      for (int lane = 0; lane < 4; ++lane) {
        element[lane] = codes[(a >> (16 * lane)) & 0xFFFF];
        element[4 + lane] = codes[(b >> (16 * lane)) & 0xFFFF];
      }
      uint32_t packed = 0;
      for (int i = 0; i < kInt4PerWord; ++i)
        packed |= (static_cast<uint32_t>(element[kInt4PackOrder[i]]) & 0xFu) << (4 * i);
      words[w] = static_cast<int32_t>(packed);
    }
  });
}

class DummyMaker {
 public:
  DummyMaker(Ops& ops, uint64_t seed) : ops_(ops), seed_(seed) {
    const std::vector<float>& z = normal_quantiles();
    const float zmax = z[kTableSize - 1];
    fp8_code_scale_ = kFp8E4M3Max / zmax;
    bf16_.resize(kTableSize);
    norm_.resize(kTableSize);
    fp8_.resize(kTableSize);
    int4_.resize(kTableSize);
    const float int4_step = static_cast<float>(kInt4Max) / kInt4RowMaxSigmas;
    for (int64_t i = 0; i < kTableSize; ++i) {
      bf16_[i] = float_to_bf16(kDummyStd * z[i]);
      norm_[i] = float_to_bf16(1.0f + kNormStd * z[i]);
      fp8_[i] = float_to_fp8_e4m3(z[i] * fp8_code_scale_);
      int4_[i] = static_cast<int8_t>(std::clamp(std::nearbyint(z[i] * int4_step), -7.0f, 7.0f));
    }
  }

  int64_t bytes() const { return bytes_; }

  // BF16 (shape) from `table`; the same `key` gives the same tensor.
  Tensor bf16_host(Shape shape, const std::vector<Bf16>& table, uint64_t key) {
    Tensor t = host_empty(DType::kBF16, std::move(shape));
    fill_from_table(t.data<Bf16>(), t.numel(), key, table);
    bytes_ += static_cast<int64_t>(t.nbytes());
    return t;
  }
  Tensor normal_host(Shape shape) { return bf16_host(std::move(shape), bf16_, next_key()); }
  Tensor norm(int64_t hidden) { return ops_.upload(bf16_host({hidden}, norm_, next_key())); }

  // A (rows, cols) weight made of stacked parts (rows `parts`, e.g. q, k and v), in `format`, with
  // one FP8 per-tensor scale per part repeated over its rows or INT4 per-row scales.
  Tensor weight(WeightFormat format, int64_t rows, int64_t cols, Tensor* scale,
                const std::vector<int64_t>& parts) {
    if (format == WeightFormat::kBf16) return normal_host({rows, cols});
    Tensor s = host_empty(DType::kF32, {rows});
    const uint64_t scale_key = next_key();
    Tensor w;
    if (format == WeightFormat::kFp8) {
      w = host_empty(DType::kF8E4M3, {rows, cols});
      fill_from_table(w.data<uint8_t>(), w.numel(), next_key(), fp8_);
      int64_t row = 0;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        const double jitter = 0.75 + 0.5 * uniform(scale_key, p);
        std::fill_n(s.data<float>() + row, parts[p],
                    static_cast<float>(kDummyStd / fp8_code_scale_ * jitter));
        row += parts[p];
      }
    } else {
      check(cols % kInt4PerWord == 0, "dummy weights: INT4 rows of ", cols,
            " columns are not a multiple of 8");
      w = host_empty(DType::kI32, {rows, cols / kInt4PerWord});
      fill_int4(w.data<int32_t>(), w.numel(), next_key(), int4_);
      for (int64_t r = 0; r < rows; ++r)
        s.data<float>()[r] = static_cast<float>(kDummyStd * kInt4RowMaxSigmas / kInt4Max *
                                                (0.75 + 0.5 * uniform(scale_key, r)));
    }
    bytes_ += static_cast<int64_t>(w.nbytes() + s.nbytes());
    *scale = s;
    return w;
  }

  Linear linear(WeightFormat format, int64_t in, const std::vector<int64_t>& parts) {
    int64_t out = 0;
    for (int64_t p : parts) out += p;
    Tensor scale;
    Tensor w = weight(format, out, in, &scale, parts);
    return {.format = format,
            .out_features = out,
            .in_features = in,
            .weight = ops_.upload(w),
            .scale = scale.defined() ? ops_.upload(scale) : Tensor(),
            .input_scale = 0.0f};
  }

  // All experts of a layer, stacked as the loader stacks them: gate_up (E, 2I, ·) with w1 rows then
  // w3 rows per expert, down (E, H, ·); scales (E, 2I) and (E, H).
  Experts experts(WeightFormat format, int64_t E, int64_t H, int64_t I) {
    Experts ex{.format = format, .num_experts = E, .hidden_size = H, .intermediate_size = I};
    std::vector<int64_t> gate_up_parts, down_parts;
    for (int64_t e = 0; e < E; ++e) {
      gate_up_parts.insert(gate_up_parts.end(), {I, I});
      down_parts.push_back(H);
    }
    ex.gate_up = weight(format, E * 2 * I, H, &ex.gate_up_scale, gate_up_parts);
    ex.down = weight(format, E * H, I, &ex.down_scale, down_parts);
    ex.gate_up = ex.gate_up.reshape({E, 2 * I, -1});
    ex.down = ex.down.reshape({E, H, -1});
    if (format != WeightFormat::kBf16) {
      ex.gate_up_scale = ex.gate_up_scale.reshape({E, 2 * I});
      ex.down_scale = ex.down_scale.reshape({E, H});
    }
    return ex;
  }

  uint64_t next_key() { return mix64(seed_ * kGamma + ++tensors_); }
  const std::vector<Bf16>& normal_table() const { return bf16_; }

 private:
  Ops& ops_;
  uint64_t seed_;
  uint64_t tensors_ = 0;
  int64_t bytes_ = 0;
  float fp8_code_scale_ = 1.0f;  // FP8 code = fp8(z × this)
  std::vector<Bf16> bf16_, norm_;
  std::vector<uint8_t> fp8_;
  std::vector<int8_t> int4_;
};

}  // namespace

ModelWeights dummy_weights(const ModelConfig& c, Quantization quantization, Ops& ops,
                           const DummyProgress& progress, uint64_t seed) {
  const WeightFormats formats = weight_formats(quantization);
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_local_experts, D = c.head_dim;
  const int64_t q = c.num_attention_heads * D, kv = c.num_key_value_heads * D;
  const bool sandwich = c.norm_placement == NormPlacement::kSandwich;
  DummyMaker make(ops, seed);

  ModelWeights w;
  const uint64_t embed_key = make.next_key();
  w.embed_tokens = ops.upload(make.bf16_host({c.vocab_size, H}, make.normal_table(), embed_key));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights layer;
    layer.pre_attn_norm = make.norm(H);
    layer.pre_moe_norm = make.norm(H);
    if (sandwich) {
      layer.post_attn_norm = make.norm(H);
      layer.post_moe_norm = make.norm(H);
    }
    layer.attention.qkv_proj = make.linear(formats.attention, H, {q, kv, kv});
    layer.attention.o_proj = make.linear(formats.attention, q, {H});
    MoeWeights moe{.router = make.normal_host({E, H}),
                   .experts = make.experts(formats.experts, E, H, I)};
    layer.moe = ops.prepare_moe(moe);
    w.layers.push_back(std::move(layer));
    if (progress) progress(i + 1, c.num_hidden_layers, make.bytes());
  }
  w.norm = make.norm(H);
  // A tied lm_head is the embedding's values in a Linear of its own, as the loader makes it.
  const Tensor lm_head = c.tie_word_embeddings
                             ? make.bf16_host({c.vocab_size, H}, make.normal_table(), embed_key)
                             : make.normal_host({c.vocab_size, H});
  w.lm_head = {.format = WeightFormat::kBf16,
               .out_features = c.vocab_size,
               .in_features = H,
               .weight = ops.upload(lm_head),
               .scale = {},
               .input_scale = 0.0f};
  return w;
}

}  // namespace nibble
