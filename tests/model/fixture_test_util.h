// Helpers for the tiny-model fixture tests: load a fixture with a quantization scheme, run a prompt
// through it, and compare logits row by row (relative L2 per position, argmax agreement).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/cpu_ops.h"
#include "engine/generator.h"
#include "model/loader.h"

namespace nibble::test {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The prompt ids of a fixture's torch reference (DIR-reference.json beside DIR).
inline std::vector<int32_t> prompt_ids(const std::string& dir) {
  return read_json(dir + "-reference.json")["ids"].get<std::vector<int32_t>>();
}

// `f` throws an error whose message contains `text`.
inline void expect_error(const std::function<void()>& f, const std::string& text) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << text << "\"";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

struct Loaded {
  CpuOps ops;
  std::unique_ptr<Model> model;
};

// The fixture in `dir` with `config` (its config.json unless given), on the CPU.
inline std::unique_ptr<Loaded> load(const std::string& dir, Quantization q,
                                    std::optional<ModelConfig> config = std::nullopt) {
  auto l = std::make_unique<Loaded>();
  ModelConfig c = config ? *config : load_model_config(dir);
  ModelWeights w = load_weights(Checkpoint::open(dir), c, q, l->ops);
  l->model = std::make_unique<Model>(std::move(c), std::move(w), l->ops);
  return l;
}

// Logits of every position of `ids` from one forward pass.
inline Tensor full_logits(Model& model, const std::vector<int32_t>& ids, KvCacheDType kv) {
  Generator g(model, static_cast<int64_t>(ids.size()), kv);
  return g.extend(ids, static_cast<int64_t>(ids.size()));
}

// Logits of every position of `ids`: the first half as one prefill, then one token at a time.
inline Tensor stepwise_logits(Model& model, const std::vector<int32_t>& ids, KvCacheDType kv) {
  const auto n = static_cast<int64_t>(ids.size()), half = n / 2;
  Generator g(model, n, kv);
  const Tensor prefill = g.extend({ids.begin(), ids.begin() + half}, half);
  const int64_t vocab = prefill.dim(1);
  Tensor steps = Tensor::zeros(DType::kF32, {n, vocab});
  std::copy_n(prefill.data<float>(), prefill.numel(), steps.data<float>());
  for (int64_t i = half; i < n; ++i) {
    const Tensor row = g.extend({ids[i]});
    std::copy_n(row.data<float>(), row.numel(), steps.data<float>() + i * vocab);
  }
  return steps;
}

inline double rel_l2(const float* ref, const float* got, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double{ref[i]} - got[i]) * (double{ref[i]} - got[i]);
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num / den);
}

struct Comparison {
  double worst = 0;     // largest per-position relative L2 error
  double mean = 0;      // mean over positions
  double whole = 0;     // relative L2 error of the whole (positions, vocab) tensor
  int argmax_diff = 0;  // positions whose argmax differs
};

inline Comparison compare(const Tensor& ref, const Tensor& got) {
  EXPECT_EQ(ref.shape(), got.shape());
  const int64_t rows = ref.dim(0), vocab = ref.dim(1);
  Comparison c;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref.data<float>() + r * vocab;
    const float* b = got.data<float>() + r * vocab;
    const double e = rel_l2(a, b, vocab);
    c.worst = std::max(c.worst, e);
    c.mean += e / static_cast<double>(rows);
    c.argmax_diff += std::max_element(a, a + vocab) - a != std::max_element(b, b + vocab) - b;
  }
  c.whole = rel_l2(ref.data<float>(), got.data<float>(), rows * vocab);
  return c;
}

// Decoding the fixture's prompt one token at a time (after a prefill of half of it) gives the logits
// of one forward pass, for bf16 and W4A8, with a BF16 and an FP8 KV cache.
inline void expect_stepwise_equals_full(const std::string& dir) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  for (const Quantization q : {Quantization::kNone, Quantization::kQuarkInt4Fp8Moe}) {
    auto l = load(dir, q);
    for (const KvCacheDType kv : {KvCacheDType::kBf16, KvCacheDType::kFp8E4M3}) {
      const Comparison c = compare(full_logits(*l->model, ids, kv), stepwise_logits(*l->model, ids, kv));
      EXPECT_LE(c.worst, 1e-4) << quantization_name(q);
      EXPECT_EQ(c.argmax_diff, 0);
    }
  }
}

// A quantization scheme and KV cache, with bounds on its logits' relative L2 from the bf16 model's.
struct SchemeBounds {
  Quantization q;
  KvCacheDType kv;
  double mean_bound;
  double worst_bound;
};

// Each scheme's logits of the fixture's prompt against the bf16 model's (printed, then bounded).
inline void expect_schemes_close_to_bf16(const std::string& dir, const std::vector<SchemeBounds>& schemes) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  auto bf16 = load(dir, Quantization::kNone);
  const Tensor ref = full_logits(*bf16->model, ids, KvCacheDType::kBf16);
  for (const SchemeBounds& c : schemes) {
    auto l = load(dir, c.q);
    const Comparison got = compare(ref, full_logits(*l->model, ids, c.kv));
    std::cout << quantization_name(c.q) << (c.kv == KvCacheDType::kFp8E4M3 ? " + fp8 kv" : "")
              << ": relative L2 vs bf16 mean " << got.mean << ", worst " << got.worst
              << "; argmax differs at " << got.argmax_diff << "/" << ids.size() << " positions\n";
    EXPECT_LE(got.mean, c.mean_bound);
    EXPECT_LE(got.worst, c.worst_bound);
  }
}

}  // namespace nibble::test
