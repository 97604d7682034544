// Tensor parallelism on the CPU: the tiny Mixtral and Grok-1 fixtures split over 2 and 4 ranks
// (threads) against the same model on one rank, for bf16 and W4A8; the shards' shapes and contents
// against hand-derived ones; the errors for a rank count that does not split the model.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "cpu/bf16_activations.h"
#include "cpu/thread_communicator.h"
#include "fixture_test_util.h"
#include "model/tensor_parallel.h"

namespace nibble {
namespace {

using test::compare;
using test::Comparison;
using test::expect_error;
using test::full_logits;
using test::prompt_ids;

constexpr char kMixtral[] = "tests/fixtures/tiny-mixtral";
constexpr char kGrok1[] = "tests/fixtures/tiny-grok1";

struct TpLoaded {
  CpuOps ops;
  std::unique_ptr<Model> model;
};

std::unique_ptr<TpLoaded> load_tp(const std::string& dir, Quantization q, int n) {
  auto l = std::make_unique<TpLoaded>();
  const ModelConfig c = load_model_config(dir);
  check_tp_size(c, n, 8);
  const ModelWeights w = load_weights(Checkpoint::open(dir), c, q, l->ops);
  std::vector<std::unique_ptr<Ops>> peers;
  for (int r = 1; r < n; ++r) peers.push_back(std::make_unique<CpuOps>());
  l->model = std::make_unique<TensorParallelModel>(c, w, l->ops, std::move(peers), make_thread_communicators(n));
  return l;
}

// The ranks' partial sums add up to the one-rank result up to fp32 summation order, for bf16 and for
// W4A8: the weights' codes and scales are the one-rank model's exactly (ShardShapesAndContents), and
// the two row-parallel FP8 inputs (o_proj's and w2's) are quantized with each row's amax over all
// ranks, so every rank rounds its slice as one rank rounds the whole row. Measured worst / mean
// (2026-11-29): bf16 ~1e-5 / 3e-6; W4A8 Mixtral 3.7e-7 / 2.3e-7 (tp 2), 4.4e-7 (tp 4), Grok-1
// 2.9e-7 / 2.1e-7. With o_proj's scale from the rank's slice only it was 0.43-0.64 worst, 0.1 mean;
// a wrong shard (a misplaced head, column or scale) gives order one.
void expect_tp_matches_one_rank(const std::string& dir) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  for (const Quantization q : {Quantization::kNone, Quantization::kQuarkInt4Fp8Moe}) {
    auto one = test::load(dir, q);
    const Tensor ref = full_logits(*one->model, ids, KvCacheDType::kBf16);
    const auto greedy = generate(*one->model, ids, 16, {}, KvCacheDType::kBf16, {});
    for (const int n : {2, 4}) {
      auto tp = load_tp(dir, q, n);
      const Comparison c = compare(ref, full_logits(*tp->model, ids, KvCacheDType::kBf16));
      std::cout << dir << " " << quantization_name(q) << " --tp-size " << n
                << " vs 1: worst relative L2 " << c.worst << ", mean " << c.mean << "\n";
      EXPECT_LE(c.worst, 1e-3) << "tp " << n;
      EXPECT_EQ(c.argmax_diff, 0) << "tp " << n;
      EXPECT_EQ(generate(*tp->model, ids, 16, {}, KvCacheDType::kBf16, {}), greedy) << "tp " << n;
    }
  }
}

TEST(TensorParallel, TinyMixtralMatchesOneRank) { expect_tp_matches_one_rank(kMixtral); }
TEST(TensorParallel, TinyGrok1MatchesOneRank) { expect_tp_matches_one_rank(kGrok1); }

// W4A8 experts with BF16 attention: the down projection's FP8 input scale per row comes from the
// row's amax over all ranks (MoeParams::communicator), so each rank quantizes its slice exactly as
// one rank quantizes the whole row, and tp N equals tp 1 up to fp32 summation order. Measured worst
// / mean: Grok-1 3.3e-7 / 2.6e-7; Mixtral 5.6e-3 / 1.9e-4 (one position, where the summation order
// of the attention all-reduce moves one FP8 code of the experts' input across a rounding boundary;
// the others ~1e-6). Without the shared amax (each rank's slice amax): worst 0.17-0.37, mean 0.04-0.05.
void expect_w4a8_experts_exact(const std::string& dir) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  const ModelConfig c = load_model_config(dir);
  CpuOps ops;
  ModelWeights w = load_weights(Checkpoint::open(dir), c, Quantization::kQuarkInt4Fp8Moe, ops);
  const ModelWeights bf16 = load_weights(Checkpoint::open(dir), c, Quantization::kNone, ops);
  for (std::size_t i = 0; i < w.layers.size(); ++i) w.layers[i].attention = bf16.layers[i].attention;
  ASSERT_EQ(w.layers[0].moe.experts.format, WeightFormat::kInt4);
  Model one(c, w, ops);
  const Tensor ref = full_logits(one, ids, KvCacheDType::kBf16);
  const auto greedy = generate(one, ids, 16, {}, KvCacheDType::kBf16, {});
  for (const int n : {2, 4}) {
    std::vector<std::unique_ptr<Ops>> peers;
    for (int r = 1; r < n; ++r) peers.push_back(std::make_unique<CpuOps>());
    TensorParallelModel tp(c, w, ops, std::move(peers), make_thread_communicators(n));
    const Comparison cmp = compare(ref, full_logits(tp, ids, KvCacheDType::kBf16));
    std::cout << dir << " INT4 experts, bf16 attention --tp-size " << n << " vs 1: worst relative L2 "
              << cmp.worst << ", mean " << cmp.mean << "\n";
    EXPECT_LE(cmp.mean, 1e-3) << "tp " << n;
    EXPECT_LE(cmp.worst, 1e-2) << "tp " << n;
    EXPECT_EQ(cmp.argmax_diff, 0) << "tp " << n;
    EXPECT_EQ(generate(tp, ids, 16, {}, KvCacheDType::kBf16, {}), greedy) << "tp " << n;
  }
}

// The GPU's precision on the CPU (Bf16ActivationOps: BF16 activations where CUDA has them), as CUDA
// runs tensor parallelism: the residual stream x and the sublayer outputs y are F32 on every rank
// count (ops.h), each rank's o_proj and MoE partial sum stays F32, the ranks sum F32 and x += y adds
// the sum unrounded. So tp 2 equals tp 1 but where fp32 summation order moves a value across the
// BF16 rounding of a norm's output (or qkv, attention), which later BF16 roundings carry on; a flip
// no longer stays in x as a BF16 step. Measured worst / mean / whole tensor: W4A8 both fixtures and
// Grok-1 bf16 0 / 0 / 0; Mixtral bf16 1.5e-3 / 5.1e-5 / 2.5e-4. Before (x BF16, the F32 sum rounded
// to BF16 as added): Mixtral bf16 6.1e-3 / 9.0e-4 / 1.9e-3; with BF16 partials (each rank's rounded,
// then their sum again): Mixtral 1.1e-2 / 8.2e-3, Grok-1 1.7e-2 / 9.6e-3.
void expect_bf16_activations_within_rounding(const std::string& dir) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  const ModelConfig c = load_model_config(dir);
  for (const Quantization q : {Quantization::kNone, Quantization::kQuarkInt4Fp8Moe}) {
    Bf16ActivationOps ops;
    const ModelWeights w = load_weights(Checkpoint::open(dir), c, q, ops);
    Model one(c, w, ops);
    const Tensor ref = full_logits(one, ids, KvCacheDType::kBf16);
    std::vector<std::unique_ptr<Ops>> peers;
    peers.push_back(std::make_unique<Bf16ActivationOps>());
    TensorParallelModel tp(c, w, ops, std::move(peers), make_thread_communicators(2));
    const Comparison cmp = compare(ref, full_logits(tp, ids, KvCacheDType::kBf16));
    std::cout << dir << " " << quantization_name(q)
              << " BF16 activations --tp-size 2 vs 1: worst relative L2 " << cmp.worst << ", mean "
              << cmp.mean << ", whole " << cmp.whole << "\n";
    EXPECT_LE(cmp.whole, 1e-3);
    EXPECT_LE(cmp.worst, 3e-3);
    EXPECT_LE(cmp.mean, 3e-4);
    EXPECT_EQ(cmp.argmax_diff, 0);
    const auto greedy = generate(one, ids, 16, {}, KvCacheDType::kBf16, {});
    EXPECT_EQ(generate(tp, ids, 16, {}, KvCacheDType::kBf16, {}), greedy);
  }
}

TEST(TensorParallel, TinyMixtralBf16ActivationsWithinRounding) { expect_bf16_activations_within_rounding(kMixtral); }
TEST(TensorParallel, TinyGrok1Bf16ActivationsWithinRounding) { expect_bf16_activations_within_rounding(kGrok1); }

TEST(TensorParallel, TinyMixtralW4A8ExpertsExact) { expect_w4a8_experts_exact(kMixtral); }
TEST(TensorParallel, TinyGrok1W4A8ExpertsExact) { expect_w4a8_experts_exact(kGrok1); }

// Bytes of row `row` of a 2-D tensor, columns [begin, end) of its stored elements.
std::vector<char> row_bytes(const Tensor& t, int64_t row, int64_t begin, int64_t end) {
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  const char* p = static_cast<const char*>(t.raw()) + (row * t.dim(1) + begin) * size;
  return {p, p + (end - begin) * size};
}

// tiny-mixtral: H 64, I 128, 4 q heads and 2 KV heads of 16, 4 experts.
TEST(TensorParallel, ShardShapesAndContents) {
  const ModelConfig c = load_model_config(kMixtral);
  ASSERT_EQ(c.head_dim, 16);
  CpuOps ops;
  const ModelWeights bf16 = load_weights(Checkpoint::open(kMixtral), c, Quantization::kNone, ops);
  const ModelWeights w4 = load_weights(Checkpoint::open(kMixtral), c, Quantization::kQuarkInt4Fp8Moe, ops);

  // Two ranks: 2 q heads and 1 KV head each; I 64.
  const ModelConfig c2 = shard_config(c, 1, 2);
  EXPECT_EQ(c2.num_attention_heads, 2);
  EXPECT_EQ(c2.num_key_value_heads, 1);
  EXPECT_EQ(c2.intermediate_size, 64);
  const LayerWeights b = shard_layer(bf16.layers[0], c, 1, 2);
  EXPECT_EQ(b.attention.qkv_proj.weight.shape(), (Shape{64, 64}));  // (2 + 1 + 1) · 16 rows
  EXPECT_EQ(b.attention.o_proj.weight.shape(), (Shape{64, 32}));
  EXPECT_EQ(b.moe.experts.gate_up.shape(), (Shape{4, 128, 64}));
  EXPECT_EQ(b.moe.experts.down.shape(), (Shape{4, 64, 64}));
  EXPECT_EQ(b.moe.router.raw(), bf16.layers[0].moe.router.raw());  // replicated, shared
  const Tensor& qkv = bf16.layers[0].attention.qkv_proj.weight;
  EXPECT_EQ(row_bytes(b.attention.qkv_proj.weight, 0, 0, 64), row_bytes(qkv, 32, 0, 64));  // q head 2
  EXPECT_EQ(row_bytes(b.attention.qkv_proj.weight, 32, 0, 64), row_bytes(qkv, 64 + 16, 0, 64));  // k head 1
  EXPECT_EQ(row_bytes(b.attention.qkv_proj.weight, 48, 0, 64), row_bytes(qkv, 96 + 16, 0, 64));  // v head 1
  EXPECT_EQ(row_bytes(b.attention.o_proj.weight, 5, 0, 32),
            row_bytes(bf16.layers[0].attention.o_proj.weight, 5, 32, 64));
  // Expert 3's up row 0 of rank 1 is the whole model's row I + 64.
  EXPECT_EQ(row_bytes(b.moe.experts.gate_up[3], 64, 0, 64),
            row_bytes(bf16.layers[0].moe.experts.gate_up[3], 128 + 64, 0, 64));

  // INT4: packed columns, 8 per I32 word; per-row scales of w2 stay whole.
  const LayerWeights q = shard_layer(w4.layers[0], c, 1, 2);
  const Experts& full = w4.layers[0].moe.experts;
  EXPECT_EQ(q.moe.experts.gate_up.shape(), (Shape{4, 128, 8}));
  EXPECT_EQ(q.moe.experts.gate_up_scale.shape(), (Shape{4, 128}));
  EXPECT_EQ(q.moe.experts.down.shape(), (Shape{4, 64, 8}));
  EXPECT_EQ(q.moe.experts.down_scale.raw(), full.down_scale.raw());
  EXPECT_EQ(row_bytes(q.moe.experts.down[2], 7, 0, 8), row_bytes(full.down[2], 7, 8, 16));
  EXPECT_EQ(q.moe.experts.gate_up_scale.data<float>()[0], full.gate_up_scale.data<float>()[64]);

  // Four ranks: 1 q head each; 2 KV heads < 4 ranks, so ranks 2 and 3 both keep KV head 1.
  const ModelConfig c4 = shard_config(c, 3, 4);
  EXPECT_EQ(c4.num_attention_heads, 1);
  EXPECT_EQ(c4.num_key_value_heads, 1);
  EXPECT_EQ(c4.intermediate_size, 32);
  const LayerWeights r3 = shard_layer(bf16.layers[0], c, 3, 4);
  EXPECT_EQ(r3.attention.qkv_proj.weight.shape(), (Shape{48, 64}));
  EXPECT_EQ(row_bytes(r3.attention.qkv_proj.weight, 16, 0, 64), row_bytes(qkv, 64 + 16, 0, 64));
  const LayerWeights r1 = shard_layer(bf16.layers[0], c, 1, 4);
  EXPECT_EQ(row_bytes(r1.attention.qkv_proj.weight, 16, 0, 64), row_bytes(qkv, 64, 0, 64));
}

TEST(TensorParallel, RankCountsThatDoNotSplitFail) {
  const ModelConfig c = load_model_config(kMixtral);
  expect_error([&] { check_tp_size(c, 3, 8); }, "--tp-size 3 does not divide num_attention_heads (4)");
  expect_error([&] { check_tp_size(c, 4, 64); },
               "--tp-size 4 must split intermediate_size (128) into parts that are multiples of 64");
  expect_error([&] { check_tp_size(c, 8, 8); }, "does not divide num_attention_heads");
  check_tp_size(c, 2, 64);
  check_tp_size(c, 4, 8);
}

// A rank that fails ends the collective on every rank with an error, not a hang.
TEST(TensorParallel, FailingRankAbortsTheGroup) {
  auto comms = make_thread_communicators(2);
  Tensor x = Tensor::zeros(DType::kF32, {4});
  std::string error;
  std::thread peer([&] {
    try {
      comms[1]->all_reduce_sum(x);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  comms[0]->abort();
  peer.join();
  EXPECT_NE(error.find("another rank failed"), std::string::npos) << error;
}

TEST(TensorParallel, ThreadAllReduceMax) {
  auto comms = make_thread_communicators(3);
  std::vector<Tensor> xs;
  const float values[3][3] = {{1.0f, -5.0f, 0.0f}, {7.0f, -6.0f, 0.0f}, {2.0f, -4.5f, 3.0f}};
  for (int r = 0; r < 3; ++r) {
    xs.push_back(Tensor::zeros(DType::kF32, {3}));
    std::copy_n(values[r], 3, xs[r].data<float>());
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { comms[r]->all_reduce_max(xs[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(xs[r].data<float>()[0], 7.0f);
    EXPECT_EQ(xs[r].data<float>()[1], -4.5f);
    EXPECT_EQ(xs[r].data<float>()[2], 3.0f);
  }
}

// CpuOps whose MoE fails: a rank that breaks in the middle of a step.
class FailingMoeOps final : public Ops {
 public:
  Device device() const override { return cpu_.device(); }
  DType activation_dtype() const override { return cpu_.activation_dtype(); }
  Tensor empty(DType dtype, Shape shape) override { return cpu_.empty(dtype, std::move(shape)); }
  Tensor upload(const Tensor& host) override { return cpu_.upload(host); }
  Tensor download(const Tensor& t) override { return cpu_.download(t); }
  MemoryInfo memory_info() const override { return cpu_.memory_info(); }
  void embedding(const Tensor& ids, const Tensor& table, Tensor& out) override { cpu_.embedding(ids, table, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) override { cpu_.rms_norm(x, w, eps, out); }
  void add(Tensor& x, const Tensor& y) override { cpu_.add(x, y); }
  void scale(Tensor& x, float factor) override { cpu_.scale(x, factor); }
  void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) override {
    cpu_.linear(x, w, out, row_group);
  }
  void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) override {
    cpu_.logits(x, rows, w, out);
  }
  void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& p, double theta) override {
    cpu_.rope(qkv, positions, p, theta);
  }
  void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType dtype, const ForwardBatch& batch,
                 const AttentionParams& p, Tensor& out) override {
    cpu_.attention(qkv, cache, dtype, batch, p, out);
  }
  void moe(const Tensor&, const MoeWeights&, const MoeParams&, Tensor&) override { fail("rank 1's MoE broke"); }

 private:
  CpuOps cpu_;
};

// A rank that fails mid-step ends the step on every rank with its error (rank 0 waits in the
// all-reduce after the MoE that rank 1 never reaches), and the group refuses later steps.
TEST(TensorParallel, FailingRankEndsTheStep) {
  const ModelConfig c = load_model_config(kMixtral);
  CpuOps ops;
  const ModelWeights w = load_weights(Checkpoint::open(kMixtral), c, Quantization::kNone, ops);
  std::vector<std::unique_ptr<Ops>> peers;
  peers.push_back(std::make_unique<FailingMoeOps>());
  TensorParallelModel tp(c, w, ops, std::move(peers), make_thread_communicators(2));
  const std::vector<int32_t> ids = prompt_ids(kMixtral);
  expect_error([&] { full_logits(tp, ids, KvCacheDType::kBf16); }, "rank 1's MoE broke");
  expect_error([&] { full_logits(tp, ids, KvCacheDType::kBf16); }, "a rank failed in an earlier step");
}

// A rank that fails while it is made ends the construction with its error, not a hang, and every
// rank's partial state is released.
TEST(TensorParallel, FailingRankSetupEndsTheGroup) {
  const ModelConfig c = load_model_config(kMixtral);
  CpuOps ops;
  const ModelWeights w = load_weights(Checkpoint::open(kMixtral), c, Quantization::kNone, ops);
  auto comms = make_thread_communicators(2);
  const TpSetup setup{
      .size = 2,
      .enter = {},
      .make_ops = [](int) -> std::unique_ptr<Ops> { return std::make_unique<CpuOps>(); },
      .make_communicator = [&](int rank) { return std::move(comms[static_cast<std::size_t>(rank)]); },
      .make_weights = [&](int rank, const ModelConfig&, Ops& rank_ops) {
        check(rank != 1, "rank 1 has no device");
        return place_shard(w, c, rank, 2, rank_ops);
      },
      .synchronize = {},
      .abort = {}};
  expect_error([&] { TensorParallelModel tp(c, setup, ops); }, "rank 1 has no device");
}

TEST(TensorParallel, ThreadAllReduceSumsInRankOrder) {
  auto comms = make_thread_communicators(3);
  std::vector<Tensor> xs;
  for (int r = 0; r < 3; ++r) {
    xs.push_back(Tensor::zeros(DType::kF32, {2}));
    xs[r].data<float>()[0] = 1e8f * (r == 0 ? 1 : r == 1 ? -1 : 0) + (r == 2 ? 1.0f : 0.0f);
    xs[r].data<float>()[1] = static_cast<float>(r + 1);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) threads.emplace_back([&, r] { comms[r]->all_reduce_sum(xs[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(xs[r].data<float>()[0], 1.0f);  // (1e8 + -1e8) + 1 in rank order
    EXPECT_EQ(xs[r].data<float>()[1], 6.0f);
  }
}

}  // namespace
}  // namespace nibble
