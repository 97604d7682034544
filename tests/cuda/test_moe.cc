// The W4A8 MoE on the GPU against its CPU twins: the grouped GEMM against its definition evaluated in
// double on identical quantized inputs, and the whole layer (decode and prefill paths; BF16 experts
// too) against CpuOps::moe, with BF16 and F32 outputs. Outputs are poisoned before each run and every
// element is checked. Shapes include sizes that are not powers of two.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>

#include "core/fp8.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/moe.h"
#include "cuda/moe_bf16.h"
#include "cuda/moe_dequant.h"
#include "cuda/moe_prefill.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/moe_quantize.h"
#include "cuda/moe_route.h"
#include "gpu_test_util.h"
#include "quant/fp8_quant.h"
#include "quant/int4.h"

namespace nibble {
namespace {

using testing::poisoned;
using testing::random_f32;
using testing::rel_l2;
using testing::to_bf16;

struct GemmCase {
  int64_t experts, n, k, tokens, top_k;
};

// Random INT4 weights for E experts (E, N, K): codes uniform over the whole range [-8, 7] (-8 included,
// which a checkpoint may hold although nibble's quantizer never writes it) and random row scales.
struct HostInt4 {
  Tensor packed;  // I32 (E, N, K/8)
  Tensor scale;   // F32 (E, N)
};

HostInt4 random_int4(int64_t E, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-8, 7);
  std::uniform_real_distribution<float> scale(0.002f, 0.006f);
  Tensor codes = Tensor::zeros(DType::kI8, {E * N, K});
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<int8_t>()[i] = static_cast<int8_t>(code(rng));
  HostInt4 w{.packed = pack_int4(codes).reshape({E, N, K / 8}), .scale = Tensor::zeros(DType::kF32, {E, N})};
  for (int64_t i = 0; i < E * N; ++i) w.scale.data<float>()[i] = scale(rng);
  return w;
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::zeros(DType::kI32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

// The GPU repack (used at load time) writes exactly the bytes of its host twin.
TEST(RepackInt4, GpuEqualsHost) {
  SKIP_WITHOUT_GPU();
  const HostInt4 w = random_int4(3, 48, 192, 11);
  const Tensor host = cuda::repack_int4_for_gemm(w.packed);
  const Tensor gpu = cuda::download(cuda::repack_int4_for_gemm_gpu(cuda::upload(w.packed)));
  ASSERT_EQ(gpu.shape(), host.shape());
  EXPECT_EQ(std::memcmp(gpu.raw(), host.raw(), static_cast<std::size_t>(host.nbytes())), 0);
}

class MoeGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(MoeGemm, MatchesItsDefinition) {
  SKIP_WITHOUT_GPU();
  const auto [E, N, K, T, top_k] = GetParam();
  const HostInt4 w = random_int4(E, N, K, 100);
  // Routing: token t goes to experts (t·7 + j·3) mod E for j < top_k, distinct when E ≥ top_k·3... so
  // spread them with a random permutation instead.
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> rows_of(E);  // expert -> tokens
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int64_t j = 0; j < top_k; ++j) rows_of[ids[j]].push_back(static_cast<int32_t>(t));
  }
  std::vector<int32_t> offsets{0}, active, act_row;
  for (int64_t e = 0; e < E; ++e) {
    if (!rows_of[e].empty()) active.push_back(static_cast<int32_t>(e));
    act_row.insert(act_row.end(), rows_of[e].begin(), rows_of[e].end());
    offsets.push_back(static_cast<int32_t>(act_row.size()));
  }
  const auto active_count = static_cast<int32_t>(active.size());
  active.resize(E + 1, 0);
  active[E] = active_count;
  const int64_t rows = T * top_k;

  // Activations: FP8 codes, scales and per-64 sums, made on the host.
  const Tensor x = random_f32({T, K}, 7);
  Tensor codes = Tensor::zeros(DType::kF8E4M3, {T, K});
  Tensor scales = Tensor::zeros(DType::kF32, {T});
  Tensor sums = Tensor::zeros(DType::kF32, {T, K / 64});
  for (int64_t t = 0; t < T; ++t) {
    scales.data<float>()[t] = quantize_fp8_row({x.data<float>() + t * K, static_cast<std::size_t>(K)},
                                               {codes.data<uint8_t>() + t * K, static_cast<std::size_t>(K)});
    for (int64_t k = 0; k < K; ++k)
      sums.data<float>()[t * (K / 64) + k / 64] += fp8_e4m3_to_float(codes.data<uint8_t>()[t * K + k]);
  }

  // The codes in sorted order too (the wgmma tiles' tensor-map reads), as the layer's quantization writes them.
  Tensor sorted_codes = Tensor::zeros(DType::kF8E4M3, {rows, K});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(sorted_codes.data<uint8_t>() + r * K, codes.data<uint8_t>() + act_row[r] * K, K);

  const int64_t slots = std::min(E, rows);
  const int64_t splits = cuda::choose_k_splits(N, K, slots, rows, 132);
  const Tensor d_weights = cuda::upload(cuda::repack_int4_for_gemm(w.packed));
  const Tensor d_scale = cuda::upload(w.scale), d_codes = cuda::upload(codes), d_scales = cuda::upload(scales),
               d_sums = cuda::upload(sums), d_act_row = cuda::upload(i32_tensor(act_row)),
               d_sorted = cuda::upload(sorted_codes),
               d_offsets = cuda::upload(i32_tensor(offsets)), d_active = cuda::upload(i32_tensor(active));
  // The definition, in double.
  std::vector<float> ref(rows * N);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      const int64_t t = act_row[r];
      for (int64_t n = 0; n < N; ++n) {
        const int32_t* wrow = w.packed.data<int32_t>() + (e * N + n) * (K / 8);
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += double{fp8_e4m3_to_float(codes.data<uint8_t>()[t * K + k])} * int4_at(wrow, k);
        ref[r * N + n] = static_cast<float>(acc * scales.data<float>()[t] * w.scale.data<float>()[e * N + n]);
      }
    }
  // Blocks of one and of two consumer warpgroups (wgmma) and mma.sync (tiles of up to 16 rows; wgmma
  // beyond), with the first weight copies before the grid dependency wait (settled routing: uploaded
  // here) or after; the splits summed.
  struct Variant {
    int groups;
    cuda::GemmMath math;
    bool settled;
    int max_tile_rows;
    const char* name;
  };
  for (const auto [groups, math, settled, max_tile_rows, name] :
       {Variant{1, cuda::GemmMath::kWgmma, false, 64, "wgmma, 1 consumer warpgroup"},
        Variant{2, cuda::GemmMath::kWgmma, true, 64, "wgmma, 2 consumer warpgroups, early weights"},
        Variant{2, cuda::GemmMath::kWgmma, true, 128, "wgmma, up to 128-row tiles, early weights"},
        Variant{1, cuda::GemmMath::kMmaSync, false, 64, "mma.sync"},
        Variant{1, cuda::GemmMath::kMmaSync, true, 64, "mma.sync, early weights"}}) {
    Tensor d_out = poisoned(DType::kF32, {splits, rows, N});
    cuda::moe_gemm_w4a8({.weights = d_weights.raw(), .weight_scale = d_scale.data<float>(),
                         .act = d_codes.data<uint8_t>(), .act_scale = d_scales.data<float>(),
                         .act_sums = d_sums.data<float>(), .act_row = d_act_row.data<int32_t>(),
                         .act_sorted = d_sorted.data<uint8_t>(),
                         .expert_offsets = d_offsets.data<int32_t>(), .active_experts = d_active.data<int32_t>(),
                         .out = d_out.data<float>(), .max_rows = rows, .num_experts = E, .n = N, .k = K,
                         .expert_slots = slots, .splits = splits, .consumer_groups = groups, .math = math,
                         .max_tile_rows = max_tile_rows, .routing_settled = settled},
                        nullptr);
    const Tensor out = cuda::download(d_out);
    std::vector<float> got(rows * N, 0.0f);
    for (int64_t s = 0; s < splits; ++s)
      for (int64_t i = 0; i < rows * N; ++i) got[i] += out.data<float>()[s * rows * N + i];
    const double err = rel_l2(ref.data(), got.data(), rows * N);
    std::cout << "E=" << E << " N=" << N << " K=" << K << " T=" << T << " top-k=" << top_k << " splits=" << splits
              << " " << name << ": relative L2 " << err << "\n";
    EXPECT_LE(err, 1e-3) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeGemm,
                         ::testing::Values(GemmCase{8, 2 * 1408, 2880, 1, 2}, GemmCase{8, 2880, 1408, 3, 2},
                                           GemmCase{8, 512, 14336, 8, 2}, GemmCase{64, 256, 1024, 64, 8},
                                           GemmCase{8, 256, 512, 1000, 1}, GemmCase{256, 128, 256, 40, 8},
                                           GemmCase{8, 128, 256, 8192, 2}, GemmCase{8, 512, 4096, 100, 2},
                                           GemmCase{8, 256, 7168, 160, 2}, GemmCase{8, 256, 512, 360, 2}));

struct LayerCase {
  int64_t experts, hidden, inter, tokens, top_k;
  // Mixtral's routing and activation unless given; Grok-1 cases add a router soft-cap (small, so
  // that it bends these random logits) to its unnormalized weights and tanh GELU.
  RouterNorm router_norm = RouterNorm::kRenormalize;
  Activation activation = Activation::kSilu;
  float router_softcap = 0.0f;
};

class MoeLayer : public ::testing::TestWithParam<LayerCase> {};

// Relative L2 distances over the whole (T, H) output: each GPU path against CpuOps::moe, and the
// prefill path against the decode path. f32_*: the same with an F32 output (a tensor-parallel rank's
// partial sum) against CpuOps::moe; rounding: the larger over both paths of the F32 output rounded to
// BF16 against the BF16 output (the same sums rounded once: equal but for rare summation-order flips).
struct LayerErrors {
  double decode, prefill, between;
  double f32_decode, f32_prefill, rounding;
};

// The GPU MoE layer on random tokens, through the decode and the prefill path (each forced, output
// poisoned before its run), against CpuOps::moe. `options` size the prefill scratch (small ones make
// several expert groups and row chunks).
LayerErrors layer_error(const MoeWeights& host, const MoeParams& params, int64_t T,
                        cuda::PrefillOptions options = {}) {
  const int64_t H = host.experts.hidden_size;
  const Tensor x_bf16 = to_bf16(random_f32({T, H}, 11));
  CpuOps cpu;
  Tensor ref = Tensor::zeros(DType::kF32, {T, H});
  cpu.moe(to_f32(x_bf16), host, params, ref);
  const cuda::MoeWeightsW4A8 w = cuda::upload_moe_w4a8(host);
  cuda::MoeWorkspace ws(w, T, params.top_k, options);
  const Tensor x = cuda::upload(x_bf16);
  auto run = [&](cuda::MoePath path, DType out_dtype) {
    Tensor out = poisoned(out_dtype, {T, H});
    cuda::moe_w4a8(x, w, params, ws, out, nullptr, path);
    return to_f32(cuda::download(out));
  };
  const Tensor decode = run(cuda::MoePath::kDecode, DType::kBF16),
               prefill = run(cuda::MoePath::kPrefill, DType::kBF16);
  const Tensor f32_decode = run(cuda::MoePath::kDecode, DType::kF32),
               f32_prefill = run(cuda::MoePath::kPrefill, DType::kF32);
  auto err = [&](const Tensor& a, const Tensor& b) { return rel_l2(a.data<float>(), b.data<float>(), T * H); };
  return {.decode = err(ref, decode),
          .prefill = err(ref, prefill),
          .between = err(decode, prefill),
          .f32_decode = err(ref, f32_decode),
          .f32_prefill = err(ref, f32_prefill),
          .rounding = std::max(err(decode, to_f32(to_bf16(f32_decode))),
                               err(prefill, to_f32(to_bf16(f32_prefill))))};
}

// The bounds every layer case meets. The GPU rounds its BF16 output (relative 2^-9), and its FP8
// tensor cores sum each 64-wide K block with reduced precision (the GEMM test measures ~2e-4);
// re-quantizing the activations to FP8 turns those differences into one-step code flips. Measured
// 3.5e-3 to 6.7e-3 on an H200 (decode).
// `prefill_bound` loosens the prefill path's: its gate_up product in BF16 (PrefillOptions) flips FP8
// codes of the activations several times as often; measured 1.47e-2 on an H200 (E 64, H 512, I 256,
// 1000 tokens, top-8), against 2.7e-3 to 3.2e-3 with the F32 product.
void expect_layer_bounds(const LayerErrors& err, double prefill_bound = 1e-2) {
  EXPECT_LE(err.decode, 1e-2);
  EXPECT_LE(err.prefill, prefill_bound);
  EXPECT_LE(err.between, prefill_bound);
  EXPECT_LE(err.f32_decode, 1e-2);
  EXPECT_LE(err.f32_prefill, prefill_bound);
  EXPECT_LE(err.rounding, 1e-4);
}

void print_errors(const LayerErrors& err) {
  std::cout << "relative L2 decode " << err.decode << ", prefill " << err.prefill << ", prefill vs decode "
            << err.between << "; F32 output decode " << err.f32_decode << ", prefill " << err.f32_prefill
            << ", rounded vs BF16 output " << err.rounding << "\n";
}

TEST_P(MoeLayer, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const auto [E, H, I, T, top_k, router_norm, activation, router_softcap] = GetParam();
  const HostInt4 gate_up = random_int4(E, 2 * I, H, 300), down = random_int4(E, H, I, 400);
  MoeWeights host{.router = to_bf16(random_f32({E, H}, 9, 0.05f)),
                  .experts = {.format = WeightFormat::kInt4, .num_experts = E, .hidden_size = H,
                              .intermediate_size = I, .gate_up = gate_up.packed, .gate_up_scale = gate_up.scale,
                              .down = down.packed, .down_scale = down.scale}};
  const MoeParams params{
      .top_k = top_k, .router_norm = router_norm, .activation = activation, .router_softcap = router_softcap};
  const LayerErrors err = layer_error(host, params, T);
  std::cout << "E=" << E << " H=" << H << " I=" << I << " T=" << T << " top-k=" << top_k << ": ";
  print_errors(err);
  expect_layer_bounds(err);
}

// Scratch small enough that the prefill path takes several expert groups (5 experts of 64 in the
// weight scratch), several row chunks per group (160 padded rows) and several combine windows (320
// rows of BF16, 160 of F32), so every combine pass (first, middle, last) runs; with the down product
// in BF16 (the default) and in F32, and the gate_up product in F32 (the default) and in BF16.
TEST(MoeLayerPrefill, ChunkedMatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const int64_t E = 64, H = 512, I = 256, T = 1000, top_k = 8;
  const HostInt4 gate_up = random_int4(E, 2 * I, H, 310), down = random_int4(E, H, I, 410);
  MoeWeights host{.router = to_bf16(random_f32({E, H}, 9, 0.05f)),
                  .experts = {.format = WeightFormat::kInt4, .num_experts = E, .hidden_size = H,
                              .intermediate_size = I, .gate_up = gate_up.packed, .gate_up_scale = gate_up.scale,
                              .down = down.packed, .down_scale = down.scale}};
  for (const auto& [product, gate_up_product] : std::vector<std::pair<DType, DType>>{
           {DType::kBF16, DType::kF32}, {DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}}) {
    const cuda::PrefillOptions options{
        .weight_scratch_bytes = 5 * 3 * I * H,
        .buffer_bytes = 160 * 2 * I * static_cast<int64_t>(dtype_size(gate_up_product)),
        .down_bytes = 320 * H * 2,
        .down_product = product,
        .gate_up_product = gate_up_product};
    const LayerErrors err = layer_error(host, {.top_k = top_k}, T, options);
    std::cout << "chunked prefill E=" << E << " H=" << H << " I=" << I << " T=" << T << " gate_up product "
              << dtype_name(gate_up_product) << ", down product " << dtype_name(product) << ": ";
    print_errors(err);
    expect_layer_bounds(err, gate_up_product == DType::kBF16 ? 2e-2 : 1e-2);
  }
}

// The prefill path's host plan (no GPU needed): padded offsets, expert groups, chunks and windows
// for random expert loads (some experts empty), checked against their definitions.
// The decode GEMM's K splits (host only): aimed at 6 units an SM, but each split keeps at least 14
// stages of 256 K unless the GPU would then hold fewer than 2 units an SM; 128-row tiles aim at 2
// chunks an SM. Hand-derived from those rules on 132 SMs (bench/RESULTS.md: the twelfth session
// measured the one-token cases, the thirtieth the 128-row ones).
TEST(ChooseKSplits, KeepsUnitsLongUnlessTheGpuWouldStarve) {
  struct Case {
    const char* what;
    int64_t n, k, experts, top_k, tokens, splits;
  };
  for (const Case c : {
           // 2 slots × 64 channel groups = 128 pairs: 6 units an SM asks 7 splits; 224 K blocks keep 4
           // splits of 14 stages; 4 × 128 units fill 2 an SM.
           Case{"Mixtral down, 1 token", 4096, 14336, 8, 2, 1, 4},
           // 8 slots: 512 pairs ask 2 splits, within the 4 long ones.
           Case{"Mixtral down, 8 tokens", 4096, 14336, 8, 2, 8, 2},
           // 896 pairs fill the GPU unsplit.
           Case{"Mixtral gate_up, 1 token", 28672, 4096, 8, 2, 1, 1},
           // 112 K blocks keep 2 long splits, but 2 × 128 units are fewer than 2 an SM: 3.
           Case{"Mixtral tp 2 down, 1 token", 4096, 7168, 8, 2, 1, 3},
           // 192 pairs ask 5 splits; 256 K blocks keep 4.
           Case{"Grok-1 tp 2 down, 1 token", 6144, 16384, 8, 2, 1, 4},
           // 8 slots × 64 groups = 512 pairs ask 2 splits of 56 K blocks (14 stages): allowed.
           Case{"DeepSeek-V3 gate_up, 1 token", 4096, 7168, 256, 8, 1, 2},
           // 128-row tiles (over 32 rows an expert) aim at 2 chunks an SM: 8 slots × 32 groups of 128
           // channels, one 64-row chunk each, ask 2 splits (6 units an SM would ask 4).
           Case{"Mixtral down, 256 tokens", 4096, 14336, 8, 2, 256, 2},
           // 256 rows an expert: 2 chunks each, 512 chunks fill the GPU unsplit.
           Case{"Mixtral down, 1024 tokens", 4096, 14336, 8, 2, 1024, 1},
           // 8 × 48 groups = 384 chunks: unsplit.
           Case{"Grok-1 tp 2 down, 256 tokens", 6144, 16384, 8, 2, 256, 1},
       }) {
    const int64_t rows = c.tokens * c.top_k, slots = std::min(c.experts, rows);
    EXPECT_EQ(cuda::choose_k_splits(c.n, c.k, slots, rows, 132), c.splits) << c.what;
  }
}

TEST(MoePrefillPlan, CoversEveryRowOnceWithinTheLimits) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t E = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<int32_t> offsets{0};
    for (int64_t e = 0; e < E; ++e) offsets.push_back(offsets.back() + (rng() % 3 == 0 ? 0 : rng() % 500));
    if (offsets.back() == 0) offsets.back() = 1;  // at least one routed row
    const int64_t slots = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t chunk_rows = cuda::kPrefillRowQuantum * (1 + static_cast<int64_t>(rng() % 64));
    const int64_t window_rows = chunk_rows + static_cast<int64_t>(rng() % 3000);
    const cuda::PrefillPlan plan = cuda::plan_prefill(offsets.data(), E, slots, chunk_rows, window_rows);
    ASSERT_EQ(static_cast<int64_t>(plan.padded_offsets.size()), E + 1);
    std::vector<int64_t> active;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t count = offsets[e + 1] - offsets[e];
      if (count > 0) active.push_back(e);
      const int64_t padded = plan.padded_offsets[e + 1] - plan.padded_offsets[e];
      ASSERT_EQ(padded % cuda::kPrefillRowQuantum, 0);
      ASSERT_TRUE(padded >= count && padded < count + cuda::kPrefillRowQuantum);
    }
    ASSERT_EQ(plan.active, active);
    ASSERT_FALSE(plan.chunks.empty());
    int64_t windows = 0;
    for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
      const cuda::PrefillChunk& chunk = plan.chunks[c];
      const int64_t prev_end = c == 0 ? 0 : plan.chunks[c - 1].end;
      ASSERT_EQ(chunk.begin, prev_end);  // contiguous from padded row 0
      ASSERT_TRUE(chunk.end > chunk.begin && chunk.end - chunk.begin <= chunk_rows);
      ASSERT_EQ(chunk.begin % cuda::kPrefillRowQuantum, 0);
      // Inside its group's padded rows.
      const int64_t first = active[chunk.group * slots];
      const int64_t last = active[std::min<int64_t>((chunk.group + 1) * slots, std::ssize(active)) - 1];
      ASSERT_TRUE(chunk.begin >= plan.padded_offsets[first] && chunk.end <= plan.padded_offsets[last + 1]);
      if (c > 0) {
        ASSERT_GE(chunk.group, plan.chunks[c - 1].group);
      }
      // Windows: spans within window_rows, and a new one only where the previous could not grow.
      ASSERT_LE(chunk.end - chunk.window_begin, window_rows);
      if (chunk.window_begin == chunk.begin) {
        ++windows;
        if (c > 0) {
          ASSERT_GT(chunk.end - plan.chunks[c - 1].window_begin, window_rows);
        }
      } else {
        ASSERT_EQ(chunk.window_begin, plan.chunks[c - 1].window_begin);
      }
    }
    EXPECT_EQ(plan.chunks.back().end, plan.padded_offsets[E]);
    EXPECT_EQ(plan.windows, windows);
  }
}

// The prefill path's dequantization: repacked INT4 -> FP8 e4m3 bytes of the INT4 values exactly, and
// repacked FP8 -> the original bytes, for a range of experts not starting at 0.
TEST(MoeDequant, ExactFromRepackedLayouts) {
  SKIP_WITHOUT_GPU();
  // The second shape has more (tile, K block) pieces than the launch has warps.
  for (const auto& [E, N, K, first, count] : std::vector<std::array<int64_t, 5>>{{4, 48, 192, 1, 2},
                                                                                {3, 2048, 7168, 1, 2}}) {
    const HostInt4 w = random_int4(E, N, K, 21);
    Tensor d_out = poisoned(DType::kU8, {count, N, K});
    const Tensor repacked = cuda::repack_int4_for_gemm_gpu(cuda::upload(w.packed));
    cuda::dequantize_experts_fp8({.format = cuda::ExpertWeightFormat::kInt4, .weights = repacked.raw(),
                                  .out = d_out.data<uint8_t>(), .first = first, .count = count, .n = N, .k = K},
                                 nullptr);
    const Tensor got = cuda::download(d_out);
    int64_t mismatches = 0;
    for (int64_t e = 0; e < count; ++e)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int32_t* row = w.packed.data<int32_t>() + ((first + e) * N + n) * (K / 8);
          const uint8_t want = float_to_fp8_e4m3(static_cast<float>(int4_at(row, k)));
          mismatches += got.data<uint8_t>()[(e * N + n) * K + k] != want;
        }
    EXPECT_EQ(mismatches, 0);

    Tensor codes = Tensor::zeros(DType::kU8, {E, N, K});
    std::mt19937 rng(3);
    for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(rng() & 0x7Eu);
    Tensor d_fp8 = poisoned(DType::kU8, {count, N, K});
    const Tensor repacked_fp8 = cuda::repack_fp8_for_gemm_gpu(cuda::upload(codes));
    cuda::dequantize_experts_fp8({.format = cuda::ExpertWeightFormat::kFp8, .weights = repacked_fp8.raw(),
                                  .out = d_fp8.data<uint8_t>(), .first = first, .count = count, .n = N, .k = K},
                                 nullptr);
    const Tensor got_fp8 = cuda::download(d_fp8);
    EXPECT_EQ(std::memcmp(got_fp8.raw(), codes.data<uint8_t>() + first * N * K, static_cast<std::size_t>(count * N * K)),
              0);
  }
}

// FP8 experts (the W8A8 comparison point) through the same grouped GEMM: random FP8 codes with
// per-tensor scales, against the CPU twin.
TEST(MoeLayerFp8, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  for (const auto& [E, H, I, T] : std::vector<std::array<int64_t, 4>>{{8, 1024, 1408, 1}, {8, 2880, 512, 37},
                                                                        {64, 512, 256, 300}}) {
    const int64_t top_k = E > 8 ? 8 : 2;
    auto random_fp8 = [](Shape shape, uint32_t seed) {
      const Tensor f = random_f32(shape, seed, 0.05f);
      Fp8Weight q = quantize_fp8_per_tensor(f.reshape({-1, shape.back()}));
      return std::pair{q.weight.reshape(shape), q.scale};
    };
    const auto [gate_up, gate_up_scale] = random_fp8({E, 2 * I, H}, 500);
    const auto [down, down_scale] = random_fp8({E, H, I}, 600);
    auto filled = [](Shape shape, float v) {
      Tensor t = Tensor::zeros(DType::kF32, shape);
      std::fill_n(t.data<float>(), t.numel(), v);
      return t;
    };
    MoeWeights host{.router = to_bf16(random_f32({E, H}, 9, 0.05f)),
                    .experts = {.format = WeightFormat::kFp8, .num_experts = E, .hidden_size = H,
                                .intermediate_size = I, .gate_up = gate_up,
                                .gate_up_scale = filled({E, 2 * I}, gate_up_scale),
                                .down = down, .down_scale = filled({E, H}, down_scale)}};
    const LayerErrors err = layer_error(host, {.top_k = top_k}, T);
    std::cout << "FP8 experts E=" << E << " H=" << H << " I=" << I << " T=" << T << ": ";
    print_errors(err);
    expect_layer_bounds(err);
  }
}

// The decode path with the activation in gate_up's epilogue (MoeWorkspace::fuse_activation) against
// the same path with gate_up's sums (one K split) and the activation kernels, F32 output poisoned
// before each run: equal bit for bit (the same activation values, so the same codes, scales and sums
// and the same down projection), for tiles of 8 and 16 rows, INT4 and FP8 experts, SiLU, GELU and tanh
// GELU, 8 and 64 experts; the calls the GEMM fuses do fuse (moe_w4a8_fuses_activation) and wider
// tiles do not; and with the rows' amax in parts from the epilogue too (MoeWorkspace::glu_amax, taken
// by the cluster activation kernel: up to 16 rows on 132 SMs, four of the cases here). Together
// with MoeLayer.MatchesCpuTwin (fused where it applies, by default), this pins the fused epilogue to
// the kernels the CPU twin checks.
TEST(MoeLayerFused, EqualsTheActivationKernels) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t E, H, I, T, K;
    Activation act;
    bool fp8;
  };
  for (const Case c : {Case{8, 1024, 1408, 1, 2, Activation::kSilu, false},
                       Case{8, 2880, 512, 5, 2, Activation::kGelu, false},
                       Case{8, 1024, 512, 32, 2, Activation::kGeluTanh, false},
                       Case{64, 512, 256, 24, 8, Activation::kSilu, false},
                       Case{64, 512, 256, 2, 8, Activation::kSilu, false},
                       Case{8, 1024, 1408, 3, 2, Activation::kGeluTanh, true},
                       Case{8, 1024, 1408, 20, 2, Activation::kGelu, true},
                       Case{8, 1024, 1408, 300, 2, Activation::kSilu, false}}) {
    const int64_t E = c.E, H = c.H, I = c.I, T = c.T;
    MoeWeights host{.router = to_bf16(random_f32({E, H}, 9, 0.05f))};
    if (c.fp8) {
      auto random_fp8 = [](Shape shape, uint32_t seed) {
        Fp8Weight q = quantize_fp8_per_tensor(random_f32(shape, seed, 0.05f).reshape({-1, shape.back()}));
        Tensor scale = Tensor::zeros(DType::kF32, {shape[0], shape[1]});
        std::fill_n(scale.data<float>(), scale.numel(), q.scale);
        return std::pair{q.weight.reshape(shape), scale};
      };
      const auto [gate_up, gate_up_scale] = random_fp8({E, 2 * I, H}, 510);
      const auto [down, down_scale] = random_fp8({E, H, I}, 610);
      host.experts = {.format = WeightFormat::kFp8, .num_experts = E, .hidden_size = H, .intermediate_size = I,
                      .gate_up = gate_up, .gate_up_scale = gate_up_scale, .down = down, .down_scale = down_scale};
    } else {
      const HostInt4 gate_up = random_int4(E, 2 * I, H, 320), down = random_int4(E, H, I, 420);
      host.experts = {.format = WeightFormat::kInt4, .num_experts = E, .hidden_size = H, .intermediate_size = I,
                      .gate_up = gate_up.packed, .gate_up_scale = gate_up.scale, .down = down.packed,
                      .down_scale = down.scale};
    }
    const MoeParams params{.top_k = c.K, .activation = c.act};
    const cuda::MoeWeightsW4A8 w = cuda::upload_moe_w4a8(host);
    cuda::MoeWorkspace ws(w, T, c.K);
    const Tensor x = cuda::upload(to_bf16(random_f32({T, H}, 12)));
    // 8 rows or fewer an expert: wgmma tiles of 8 or 16 rows, which fuse; 300 tokens: 64-row tiles.
    const bool fusable = T * c.K <= 8 * E;
    auto run = [&](bool fuse, bool amax = false) {
      ws.fuse_activation = fuse;
      ws.glu_amax = amax;
      ws.gate_up_splits = 1;  // the fused epilogue's one split, so that the sums are the same
      EXPECT_EQ(cuda::moe_w4a8_fuses_activation(w, ws, T, c.K), fuse && fusable) << "T " << T;
      Tensor out = poisoned(DType::kF32, {T, H});
      cuda::moe_w4a8(x, w, params, ws, out, nullptr, cuda::MoePath::kDecode);
      return cuda::download(out);
    };
    const Tensor fused = run(true), apart = run(false), with_amax = run(true, true);
    EXPECT_EQ(std::memcmp(fused.raw(), apart.raw(), fused.nbytes()), 0)
        << "E " << E << " H " << H << " I " << I << " T " << T << (c.fp8 ? " FP8" : " INT4");
    EXPECT_EQ(std::memcmp(with_amax.raw(), apart.raw(), fused.nbytes()), 0)
        << "the epilogue's amax: E " << E << " H " << H << " I " << I << " T " << T << (c.fp8 ? " FP8" : " INT4");
    EXPECT_GT(rel_l2(fused.data<float>(), std::vector<float>(T * H, 0.0f).data(), T * H), 0.5);  // not all zeros
  }
}

// BF16 experts (`--quantization none`, cuBLAS) with a BF16 output and an F32 one (a tensor-parallel
// rank's partial sum), each poisoned first, against CpuOps::moe. The GPU rounds the activation
// between the GEMMs to BF16 (the CPU keeps F32): about 1e-3 apart.
TEST(MoeLayerBf16, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  const int64_t E = 8, H = 1024, I = 512, T = 37;
  const MoeParams params{.top_k = 2};
  MoeWeights host{.router = to_bf16(random_f32({E, H}, 9, 0.05f)),
                  .experts = {.format = WeightFormat::kBf16, .num_experts = E, .hidden_size = H,
                              .intermediate_size = I, .gate_up = to_bf16(random_f32({E, 2 * I, H}, 700, 0.03f)),
                              .down = to_bf16(random_f32({E, H, I}, 800, 0.03f))}};
  const Tensor x_bf16 = to_bf16(random_f32({T, H}, 11));
  CpuOps cpu;
  Tensor ref = Tensor::zeros(DType::kF32, {T, H});
  cpu.moe(to_f32(x_bf16), host, params, ref);

  MoeWeights dev = host;
  dev.router = cuda::upload(host.router);
  dev.experts.gate_up = cuda::upload(host.experts.gate_up);
  dev.experts.down = cuda::upload(host.experts.down);
  cublasHandle_t handle = nullptr;
  ASSERT_EQ(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
  cuda::MoeBf16Workspace ws;
  const Tensor x = cuda::upload(x_bf16);
  Tensor bf16_out = poisoned(DType::kBF16, {T, H}), f32_out = poisoned(DType::kF32, {T, H});
  cuda::moe_bf16(x, dev, params, ws, bf16_out, handle, nullptr);
  cuda::moe_bf16(x, dev, params, ws, f32_out, handle, nullptr);
  const Tensor got_bf16 = to_f32(cuda::download(bf16_out)), got_f32 = cuda::download(f32_out);
  cublasDestroy(handle);
  const double bf16_err = rel_l2(ref.data<float>(), got_bf16.data<float>(), T * H);
  const double f32_err = rel_l2(ref.data<float>(), got_f32.data<float>(), T * H);
  const Tensor rounded = to_f32(to_bf16(got_f32));
  const double rounding = rel_l2(got_bf16.data<float>(), rounded.data<float>(), T * H);
  std::cout << "BF16 experts: relative L2 BF16 output " << bf16_err << ", F32 output " << f32_err
            << ", F32 rounded vs BF16 output " << rounding << "\n";
  EXPECT_LE(bf16_err, 1e-2);
  EXPECT_LE(f32_err, 1e-2);
  EXPECT_LE(rounding, 1e-4);
}

// route_and_group (one launch for up to 1024 tokens: a cluster for few pairs, else blocks counting
// themselves done, the last of a token tile taking its top-k and the last tile grouping; else three
// kernels) against route_topk +
// group_by_expert (the same logits, ids and weights bit for bit) and against the routing defined on
// the host in double (soft-cap, softmax, top-k with ties to the lower id, optional renormalization);
// the grouping checked against its definition (each expert's rows contiguous in id order, every pair
// exactly once). Against the host, tokens whose k-th and (k+1)-th probabilities are within 1e-5 may
// pick either. Cluster launch: 4 tokens of 8 experts (the largest), 2 of 16 with a soft-cap, 1 of 8;
// block a token: 5, 32, 200 (soft-cap) and 1024 tokens of 8 experts; tiles: 13, 40, 256 and 700 tokens
// of 24 to 256 experts; three kernels (their logit tiles): 2000 tokens of 64 experts; the logits of
// cuBLAS (RouteArgs::blas, from kTensorLogitsMinTokens tokens): 1100 tokens of 256 experts, and of 8
// with a soft-cap.
TEST(RouteAndGroup, MatchesHostRouting) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t E, H, T, K;
    RouterNorm norm = RouterNorm::kRenormalize;
    float softcap = 0.0f;
    bool tensor_logits = false;
  };
  cublasHandle_t blas = nullptr;
  ASSERT_EQ(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS);
  for (const Case c : {Case{8, 4096, 1, 2}, Case{8, 4096, 4, 2}, Case{8, 4096, 5, 2}, Case{8, 4096, 32, 2},
                       Case{256, 7168, 1, 8}, Case{16, 1040, 2, 2, RouterNorm::kNone, 2.0f},
                       Case{64, 1040, 13, 2, RouterNorm::kNone, 2.0f}, Case{256, 1040, 700, 8},
                       Case{256, 7168, 256, 8}, Case{64, 1040, 2000, 2}, Case{24, 1040, 40, 2},
                       Case{8, 1040, 200, 2, RouterNorm::kNone, 30.0f}, Case{8, 1040, 1024, 2},
                       Case{256, 1040, 1100, 8, RouterNorm::kRenormalize, 0.0f, true},
                       Case{8, 4096, 1100, 2, RouterNorm::kNone, 30.0f, true}}) {
    const int64_t E = c.E, H = c.H, T = c.T, K = c.K;
    const Tensor x = to_bf16(random_f32({T, H}, 31)), router = to_bf16(random_f32({E, H}, 32, 0.05f));
    const Tensor xf = to_f32(x), rf = to_f32(router);
    const Tensor d_x = cuda::upload(x), d_router = cuda::upload(router);
    Tensor done = cuda::upload(Tensor::zeros(DType::kI32, {cuda::kRouteCounters}));  // the one-launch path's counter
    auto route = [&](bool fused) {
      struct Out {
        Tensor logits, ids, weights, offsets, active, sorted, pos;
      } o{poisoned(DType::kF32, {T, E}), poisoned(DType::kI32, {T, K}), poisoned(DType::kF32, {T, K}),
          poisoned(DType::kI32, {E + 1}), poisoned(DType::kI32, {E + 1}), poisoned(DType::kI32, {T * K}),
          poisoned(DType::kI32, {T * K})};
      const cuda::RouteArgs r{.x = d_x.raw(), .router = d_router.raw(), .logits = o.logits.data<float>(),
                              .topk_ids = o.ids.data<int32_t>(), .topk_weights = o.weights.data<float>(),
                              .tokens = T, .hidden = H, .experts = E, .top_k = K, .norm = c.norm, .softcap = c.softcap,
                              .blas = c.tensor_logits ? blas : nullptr};
      const cuda::GroupArgs g{.topk_ids = o.ids.data<int32_t>(), .expert_offsets = o.offsets.data<int32_t>(),
                              .active_experts = o.active.data<int32_t>(), .sorted_tokens = o.sorted.data<int32_t>(),
                              .row_pos = o.pos.data<int32_t>(), .tokens = T, .experts = E, .top_k = K,
                              .blocks_done = reinterpret_cast<uint32_t*>(done.data<int32_t>())};
      if (fused) {
        cuda::route_and_group(r, g, nullptr);
      } else {
        cuda::route_topk(r, nullptr);
        cuda::group_by_expert(g, nullptr);
      }
      return Out{cuda::download(o.logits), cuda::download(o.ids), cuda::download(o.weights), cuda::download(o.offsets),
                 cuda::download(o.active), cuda::download(o.sorted), cuda::download(o.pos)};
    };
    // The one-launch paths twice (the counted one must have reset its counter), then the three kernels.
    const auto got = route(true), again = route(true), plain = route(false);
    for (int64_t i = 0; i < T * K; ++i) {
      ASSERT_EQ(again.ids.data<int32_t>()[i], got.ids.data<int32_t>()[i]) << "pair " << i;
      ASSERT_EQ(again.pos.data<int32_t>()[i], got.pos.data<int32_t>()[i]) << "pair " << i;
    }
    int64_t ties = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> prob(E);
      double mx = -1e300;
      for (int64_t e = 0; e < E; ++e) {
        double l = 0;
        for (int64_t h = 0; h < H; ++h) l += double{xf.data<float>()[t * H + h]} * rf.data<float>()[e * H + h];
        EXPECT_NEAR(got.logits.data<float>()[t * E + e], l, 1e-5 * (std::fabs(l) + 1)) << "token " << t;
        EXPECT_EQ(got.logits.data<float>()[t * E + e], plain.logits.data<float>()[t * E + e]) << "token " << t;
        if (c.softcap > 0) l = c.softcap * std::tanh(l / c.softcap);
        prob[e] = l;
        mx = std::max(mx, l);
      }
      double sum = 0;
      for (double& v : prob) sum += v = std::exp(v - mx);
      for (double& v : prob) v /= sum;
      for (int64_t k = 0; k < K; ++k) {  // the one-launch path computes exactly what the three kernels do
        EXPECT_EQ(got.ids.data<int32_t>()[t * K + k], plain.ids.data<int32_t>()[t * K + k]) << "token " << t;
        EXPECT_EQ(got.weights.data<float>()[t * K + k], plain.weights.data<float>()[t * K + k]) << "token " << t;
      }
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return prob[a] > prob[b]; });
      if (K < E && prob[order[K - 1]] - prob[order[K]] < 1e-5) {
        ++ties;
        continue;
      }
      double top = 0;
      for (int64_t k = 0; k < K; ++k) top += prob[order[k]];
      for (int64_t k = 0; k < K; ++k) {
        const double want = c.norm == RouterNorm::kRenormalize ? prob[order[k]] / top : prob[order[k]];
        // Within the top k the order may swap where two probabilities are this close.
        if (k + 1 < K && prob[order[k]] - prob[order[k + 1]] < 1e-5) continue;
        if (k > 0 && prob[order[k - 1]] - prob[order[k]] < 1e-5) continue;
        EXPECT_EQ(got.ids.data<int32_t>()[t * K + k], order[k]) << "token " << t << " k " << k;
        EXPECT_NEAR(got.weights.data<float>()[t * K + k], want, 1e-5) << "token " << t << " k " << k;
      }
    }
    // The grouping of the fused run, from its own top-k ids.
    std::vector<int32_t> counts(E, 0);
    for (int64_t i = 0; i < T * K; ++i) ++counts[got.ids.data<int32_t>()[i]];
    int32_t offset = 0, active = 0;
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(got.offsets.data<int32_t>()[e], offset) << "expert " << e;
      if (counts[e] > 0) {
        EXPECT_EQ(got.active.data<int32_t>()[active++], e);
      }
      offset += counts[e];
    }
    EXPECT_EQ(got.offsets.data<int32_t>()[E], T * K);
    EXPECT_EQ(got.active.data<int32_t>()[E], active);
    // Rows keep the pairs' order within an expert (a stable sort), on both paths.
    std::vector<int32_t> next(got.offsets.data<int32_t>(), got.offsets.data<int32_t>() + E);
    for (int64_t i = 0; i < T * K; ++i) {
      const int32_t pos = got.pos.data<int32_t>()[i], e = got.ids.data<int32_t>()[i];
      ASSERT_EQ(pos, next[e]++) << "pair " << i << " of expert " << e;
      EXPECT_EQ(got.sorted.data<int32_t>()[pos], i / K) << "pair " << i;
      EXPECT_EQ(plain.pos.data<int32_t>()[i], pos) << "pair " << i;
      EXPECT_EQ(plain.sorted.data<int32_t>()[pos], i / K) << "pair " << i;
    }
    std::cout << "route E=" << E << " H=" << H << " T=" << T << " top-k=" << K
              << (c.tensor_logits ? " (cuBLAS logits)" : "") << ": " << ties << " near-tied tokens skipped\n";
    EXPECT_LE(ties, T / 10 + 1);
  }
  cublasDestroy(blas);
}

// quantize_rows_fp8 against the CPU twin's definition (quantize_fp8_row): each row's codes and scale
// bit for bit, and each 64-block's sum of the codes' values; dynamic and static scales, a gather with
// a padding row (zero codes, scale and sums), rows of 1 to 8 units a thread and, past 16384 columns,
// the wide kernel (up to 512 threads); outputs poisoned, every element checked.
TEST(QuantizeRows, MatchesCpuTwin) {
  SKIP_WITHOUT_GPU();
  for (const int64_t cols : {64, 1088, 4096, 14336, 16384, 18432, 32768})
    for (const bool gather : {false, true})
      for (const float static_scale : {0.0f, 0.004f}) {
        const int64_t src_rows = 3, R = gather ? 4 : src_rows;
        const Tensor x = to_bf16(random_f32({src_rows, cols}, static_cast<uint32_t>(cols + gather), 2.0f));
        const std::vector<int32_t> src = gather ? std::vector<int32_t>{2, -1, 0, 2} : std::vector<int32_t>{0, 1, 2};
        const Tensor d_x = cuda::upload(x), d_src = cuda::upload(i32_tensor(src));
        Tensor codes = poisoned(DType::kU8, {R, cols}), scale = poisoned(DType::kF32, {R}),
               sums = poisoned(DType::kF32, {R, cols / 64});
        cuda::quantize_rows_fp8({.x = d_x.raw(), .codes = codes.data<uint8_t>(), .scale = scale.data<float>(),
                                 .sums = sums.data<float>(), .rows = R, .cols = cols, .static_scale = static_scale,
                                 .src_row = gather ? d_src.data<int32_t>() : nullptr},
                                nullptr);
        const Tensor got_codes = cuda::download(codes), got_scale = cuda::download(scale),
                     got_sums = cuda::download(sums);
        const Tensor xf = to_f32(x);
        std::vector<uint8_t> want(cols);
        for (int64_t r = 0; r < R; ++r) {
          const std::string where = "cols " + std::to_string(cols) + (gather ? " gathered" : "") +
                                    (static_scale > 0.0f ? " static" : "") + " row " + std::to_string(r);
          float want_scale = 0.0f;
          std::fill(want.begin(), want.end(), uint8_t{0});
          if (src[r] >= 0)
            want_scale = quantize_fp8_row({xf.data<float>() + src[r] * cols, static_cast<size_t>(cols)}, want,
                                          static_scale);
          EXPECT_EQ(got_scale.data<float>()[r], want_scale) << where;
          EXPECT_EQ(std::memcmp(got_codes.data<uint8_t>() + r * cols, want.data(), cols), 0) << where;
          for (int64_t b = 0; b < cols / 64; ++b) {
            float sum = 0.0f;  // exact in fp32 in any order
            for (int64_t i = b * 64; i < b * 64 + 64; ++i) sum += fp8_e4m3_to_float(want[i]);
            EXPECT_EQ(got_sums.data<float>()[r * (cols / 64) + b], sum) << where << " block " << b;
          }
        }
      }
}

// route_and_group given x's quantization: inside the routing launch (up to 1024 tokens: one block a
// token for 8 experts, tiles of tokens and experts for more) or after it (1100 tokens), the codes, scales and 64-block sums of quantize_rows_fp8 and the
// routing of route_and_group alone, bit for bit; row lengths of 1, 2, 3 and several units a thread.
TEST(RouteAndGroup, QuantizesLikeQuantizeRows) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t E, H, T;
    bool inside;
  };
  for (const Case c : {Case{8, 4096, 1, true}, Case{8, 4096, 32, true}, Case{8, 6144, 5, true},
                       Case{8, 1088, 3, true}, Case{8, 14336, 2, true}, Case{16, 1024, 4, true},
                       Case{256, 7168, 1, true}, Case{256, 7168, 20, true}, Case{64, 1088, 1100, false}}) {
    const int64_t E = c.E, H = c.H, T = c.T, K = 2;
    const Tensor x = cuda::upload(to_bf16(random_f32({T, H}, 33, 3.0f)));
    const Tensor router = cuda::upload(to_bf16(random_f32({E, H}, 34, 0.05f)));
    Tensor done = cuda::upload(Tensor::zeros(DType::kI32, {cuda::kRouteCounters}));
    struct Out {
      Tensor ids, pos, codes, scale, sums;
    };
    auto run = [&](bool fused) {
      Out o{poisoned(DType::kI32, {T, K}), poisoned(DType::kI32, {T * K}), poisoned(DType::kU8, {T, H}),
            poisoned(DType::kF32, {T}), poisoned(DType::kF32, {T, H / 64})};
      Tensor logits = poisoned(DType::kF32, {T, E}), weights = poisoned(DType::kF32, {T, K});
      Tensor offsets = poisoned(DType::kI32, {E + 1}), active = poisoned(DType::kI32, {E + 1});
      Tensor sorted = poisoned(DType::kI32, {T * K});
      const cuda::RouteArgs r{.x = x.raw(), .router = router.raw(), .logits = logits.data<float>(),
                              .topk_ids = o.ids.data<int32_t>(), .topk_weights = weights.data<float>(),
                              .tokens = T, .hidden = H, .experts = E, .top_k = K, .norm = RouterNorm::kRenormalize,
                              .softcap = 0.0f};
      const cuda::GroupArgs g{.topk_ids = o.ids.data<int32_t>(), .expert_offsets = offsets.data<int32_t>(),
                              .active_experts = active.data<int32_t>(), .sorted_tokens = sorted.data<int32_t>(),
                              .row_pos = o.pos.data<int32_t>(), .tokens = T, .experts = E, .top_k = K,
                              .blocks_done = reinterpret_cast<uint32_t*>(done.data<int32_t>())};
      const cuda::QuantizeRowsArgs q{.x = x.raw(), .codes = o.codes.data<uint8_t>(), .scale = o.scale.data<float>(),
                                     .sums = o.sums.data<float>(), .rows = T, .cols = H};
      if (fused) {
        EXPECT_EQ(cuda::route_and_group(r, g, nullptr, &q), c.inside) << "H " << H << " T " << T;
      } else {
        cuda::route_and_group(r, g, nullptr);
        cuda::quantize_rows_fp8(q, nullptr);
      }
      return Out{cuda::download(o.ids), cuda::download(o.pos), cuda::download(o.codes), cuda::download(o.scale),
                 cuda::download(o.sums)};
    };
    const Out got = run(true), want = run(false);
    auto same = [](const Tensor& a, const Tensor& b) { return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0; };
    EXPECT_TRUE(same(got.ids, want.ids)) << "top-k ids, H " << H << " T " << T;
    EXPECT_TRUE(same(got.pos, want.pos)) << "rows, H " << H << " T " << T;
    EXPECT_TRUE(same(got.codes, want.codes)) << "codes, H " << H << " T " << T;
    EXPECT_TRUE(same(got.scale, want.scale)) << "scales, H " << H << " T " << T;
    EXPECT_TRUE(same(got.sums, want.sums)) << "sums, H " << H << " T " << T;
  }
}

// activation_quantize_fp8 (a cluster of blocks a row) against its definition on the host: split-K
// partial sums added in order, optional row × channel scaling (the prefill path, padding rows with
// expert -1 included), the activation times up, then per-row FP8 codes, scale and per-64 sums. The
// host's exp/erf/tanh may differ from the GPU's in the last bit, so a code may sit one step away where
// a value lies on a rounding boundary: at most 1 in 1000 codes. Column counts with 64-blocks that do
// not divide evenly over the cluster, and fewer 64-blocks than cluster blocks.
float host_activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: return x / (1.0f + std::exp(-x));
    case Activation::kGelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::kGeluTanh:
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

// Routing and grouping as decode runs it (20 calls recorded in a CUDA graph, replayed): µs a call.
// Run it under NIBBLE_ROUTE=cluster and =counted (scripts/gpu-check) to compare the one-launch kernels.
TEST(RouteAndGroup, Timing) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    int64_t E, H, T, K;
  };
  for (const Case c : {Case{"Mixtral", 8, 4096, 1, 2}, Case{"Mixtral", 8, 4096, 4, 2},
                       Case{"Mixtral", 8, 4096, 16, 2}, Case{"Mixtral", 8, 4096, 32, 2},
                       Case{"Grok-1", 8, 6144, 1, 2}, Case{"DeepSeek-V3", 256, 7168, 1, 8},
                       Case{"DeepSeek-V3", 256, 7168, 8, 8}, Case{"DeepSeek-V3", 256, 7168, 256, 8}}) {
    const Tensor d_x = cuda::upload(to_bf16(random_f32({c.T, c.H}, 31)));
    const Tensor d_router = cuda::upload(to_bf16(random_f32({c.E, c.H}, 32, 0.05f)));
    Tensor done = cuda::upload(Tensor::zeros(DType::kI32, {cuda::kRouteCounters}));
    Tensor logits = cuda::empty(DType::kF32, {c.T, c.E}), ids = cuda::empty(DType::kI32, {c.T, c.K});
    Tensor weights = cuda::empty(DType::kF32, {c.T, c.K}), offsets = cuda::empty(DType::kI32, {c.E + 1});
    Tensor active = cuda::empty(DType::kI32, {c.E + 1}), sorted = cuda::empty(DType::kI32, {c.T * c.K});
    Tensor pos = cuda::empty(DType::kI32, {c.T * c.K});
    const cuda::RouteArgs r{.x = d_x.raw(), .router = d_router.raw(), .logits = logits.data<float>(),
                            .topk_ids = ids.data<int32_t>(), .topk_weights = weights.data<float>(), .tokens = c.T,
                            .hidden = c.H, .experts = c.E, .top_k = c.K};
    const cuda::GroupArgs g{.topk_ids = ids.data<int32_t>(), .expert_offsets = offsets.data<int32_t>(),
                            .active_experts = active.data<int32_t>(), .sorted_tokens = sorted.data<int32_t>(),
                            .row_pos = pos.data<int32_t>(), .tokens = c.T, .experts = c.E, .top_k = c.K,
                            .blocks_done = reinterpret_cast<uint32_t*>(done.data<int32_t>())};
    cudaStream_t stream = cuda::compute_stream();
    constexpr int kCalls = 20, kReplays = 20;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kCalls; ++i) cuda::route_and_group(r, g, stream);
    cuda_check(cudaStreamEndCapture(stream, &graph));
    cuda_check(cudaGraphInstantiate(&exec, graph, 0));
    cuda_check(cudaGraphLaunch(exec, stream));
    const float ms = testing::gpu_milliseconds(stream, [&] {
      for (int i = 0; i < kReplays; ++i) cuda_check(cudaGraphLaunch(exec, stream));
    });
    std::cout << "route and group " << c.name << " (E " << c.E << ", H " << c.H << ", top-" << c.K << "), " << c.T
              << " tokens: " << 1000.0 * ms / (kCalls * kReplays) << " us a call\n";
    cuda_check(cudaGraphExecDestroy(exec));
    cuda_check(cudaGraphDestroy(graph));
  }
}

TEST(ActivationQuantize, MatchesHostDefinition) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int64_t I, rows, max_rows, splits;
    Activation act;
    bool prefill;  // unscaled product with row and channel scales, every fifth row padding
  };
  for (const Case c : {Case{128, 1, 1, 1, Activation::kSilu, false}, Case{576, 2, 3, 3, Activation::kGelu, false},
                       Case{14336, 2, 2, 4, Activation::kSilu, false},
                       Case{1408, 37, 40, 2, Activation::kGeluTanh, false},
                       Case{512, 20, 20, 1, Activation::kSilu, true},
                       Case{576, 5, 5, 1, Activation::kGelu, true}, Case{1408, 9, 9, 1, Activation::kGeluTanh, false},
                       Case{14336, 600, 600, 1, Activation::kSilu, true}}) {  // prefill-sized
    const int64_t I = c.I, R = c.rows, E = 3;
    // With one split the values are BF16's (exact in F32), so that the product's BF16 copy
    // (ActivationArgs::gate_up_bf16) must give the F32 kernels' outputs bit for bit.
    const Tensor random_gate_up = random_f32({c.splits, c.max_rows, 2 * I}, 21, c.prefill ? 40.0f : 0.5f);
    const Tensor gate_up = c.splits == 1 ? to_f32(to_bf16(random_gate_up)) : random_gate_up;
    const Tensor row_scale = random_f32({R}, 22, 0.05f), channel = random_f32({E, 2 * I}, 23, 0.05f);
    std::vector<int32_t> expert(R);
    for (int64_t r = 0; r < R; ++r) expert[r] = r % 5 == 4 ? -1 : static_cast<int32_t>(r % E);
    // The host definition.
    std::vector<float> values(R * I), amax(R, 0.0f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < I; ++i) {
        float g = 0.0f, u = 0.0f;
        for (int64_t s = 0; s < c.splits; ++s) {
          g += gate_up.data<float>()[(s * c.max_rows + r) * 2 * I + i];
          u += gate_up.data<float>()[(s * c.max_rows + r) * 2 * I + I + i];
        }
        if (c.prefill && expert[r] >= 0) {
          const float* ch = channel.data<float>() + expert[r] * 2 * I;
          g = g * row_scale.data<float>()[r] * ch[i];
          u = u * row_scale.data<float>()[r] * ch[I + i];
        }
        values[r * I + i] = c.prefill && expert[r] < 0 ? 0.0f : host_activate(c.act, g) * u;
        amax[r] = std::max(amax[r], std::fabs(values[r * I + i]));
      }
    // The same columns interleaved by 8 (ActivationArgs::interleaved): gate i at 16·(i / 8) + i % 8, up 8 on.
    auto interleave = [&](const Tensor& t) {
      Tensor out = Tensor::zeros(DType::kF32, t.shape());
      const int64_t n = t.numel() / (2 * I);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t half = 0; half < 2; ++half)
            out.data<float>()[r * 2 * I + 16 * (i / 8) + i % 8 + 8 * half] = t.data<float>()[r * 2 * I + half * I + i];
      return out;
    };
    const Tensor d_gate_up = cuda::upload(gate_up), d_gate_up_bf16 = cuda::upload(to_bf16(gate_up)),
                 d_row_scale = cuda::upload(row_scale),
                 d_channel = cuda::upload(channel), d_expert = cuda::upload(i32_tensor(expert));
    const Tensor i_gate_up = interleave(gate_up);
    const Tensor d_i_gate_up = cuda::upload(i_gate_up), d_i_gate_up_bf16 = cuda::upload(to_bf16(i_gate_up)),
                 d_i_channel = cuda::upload(interleave(channel));
    // Both kernels against the host definition; the row kernel's outputs are the cluster's, bit for bit.
    // With one K split, each kernel's one-split variant too, on F32 and on BF16 (one_split 2 here); each
    // also on the interleaved columns, the same outputs bit for bit.
    std::vector<Tensor> cluster_outputs;
    for (const bool interleaved : {false, true})
    for (const auto& [kernel, one_split] : std::vector<std::pair<cuda::ActivationKernel, int>>{
             {cuda::ActivationKernel::kCluster, 0}, {cuda::ActivationKernel::kRows, 0},
             {cuda::ActivationKernel::kCluster, 1}, {cuda::ActivationKernel::kRows, 1},
             {cuda::ActivationKernel::kCluster, 2}, {cuda::ActivationKernel::kRows, 2}}) {
      if (one_split == 2 && c.splits != 1) continue;
      Tensor codes = poisoned(DType::kU8, {R, I}), scale = poisoned(DType::kF32, {R}),
             sums = poisoned(DType::kF32, {R, I / 64}), amax_out = poisoned(DType::kF32, {R});
      cuda::ActivationArgs args{.gate_up = (interleaved ? d_i_gate_up : d_gate_up).data<float>(),
                                .interleaved = interleaved, .splits = c.splits, .max_rows = c.max_rows,
                                .codes = codes.data<uint8_t>(), .scale = scale.data<float>(),
                                .sums = sums.data<float>(), .rows = R, .intermediate = I, .activation = c.act,
                                .kernel = kernel,
                                .one_split = std::min(one_split, 1)};
      if (one_split == 2) {
        args.gate_up = nullptr;
        args.gate_up_bf16 = (interleaved ? d_i_gate_up_bf16 : d_gate_up_bf16).raw();
      }
      if (c.prefill) {
        args.row_scale = d_row_scale.data<float>();
        args.channel_scale = (interleaved ? d_i_channel : d_channel).data<float>();
        args.row_expert = d_expert.data<int32_t>();
      }
      cuda::activation_quantize_fp8(args, nullptr);
      cuda::ActivationArgs amax_pass = args;
      amax_pass.amax_out = amax_out.data<float>();
      cuda::activation_quantize_fp8(amax_pass, nullptr);
      const Tensor got_codes = cuda::download(codes), got_scale = cuda::download(scale),
                   got_sums = cuda::download(sums), got_amax = cuda::download(amax_out);
      int64_t flips = 0;
      for (int64_t r = 0; r < R; ++r) {
        const bool padding = c.prefill && expert[r] < 0;
        const float want_scale = padding ? 0.0f : std::max(amax[r], kMinActivationAmax) / kFp8E4M3Max;
        EXPECT_NEAR(got_scale.data<float>()[r], want_scale, 1e-6f * want_scale) << "I " << I << " row " << r;
        EXPECT_NEAR(got_amax.data<float>()[r], amax[r], 1e-6f * amax[r]) << "I " << I << " row " << r;
        for (int64_t b = 0; b < I / 64; ++b) {
          float sum = 0.0f;  // of the GPU's own codes, which must match the host's
          for (int64_t i = b * 64; i < b * 64 + 64; ++i) {
            const uint8_t got = got_codes.data<uint8_t>()[r * I + i];
            const uint8_t want = padding ? 0 : float_to_fp8_e4m3(values[r * I + i] / want_scale);
            if (got != want) {
              ++flips;
              const float w = fp8_e4m3_to_float(want);
              EXPECT_NEAR(fp8_e4m3_to_float(got), w, 0.13f * std::fabs(w) + 0.002f)
                  << "I " << I << " row " << r << " column " << i;
            }
            sum += fp8_e4m3_to_float(got);
          }
          EXPECT_NEAR(got_sums.data<float>()[r * (I / 64) + b], sum, 1e-5f * (std::fabs(sum) + 1.0f))
              << "I " << I << " row " << r << " block " << b;
        }
      }
      std::cout << "activation I=" << I << " rows=" << R << " splits=" << c.splits << (c.prefill ? " prefill" : "")
                << (kernel == cuda::ActivationKernel::kRows ? ", row kernel" : ", cluster kernel")
                << (one_split == 2 ? " (one split, BF16 product)" : one_split == 1 && c.splits == 1 ? " (one split)" : "")
                << (interleaved ? ", interleaved" : "")
                << ": " << flips
                << " of " << R * I << " codes one step off\n";
      EXPECT_LE(flips, R * I / 1000 + 1);
      const std::vector<Tensor> outputs{got_codes, got_scale, got_sums, got_amax};
      if (kernel == cuda::ActivationKernel::kCluster && one_split == 0 && !interleaved) {
        cluster_outputs = outputs;
      } else {
        for (std::size_t k = 0; k < outputs.size(); ++k)
          EXPECT_EQ(std::memcmp(outputs[k].raw(), cluster_outputs[k].raw(), outputs[k].nbytes()), 0)
              << "I " << I << ": output " << k << " of kernel " << static_cast<int>(kernel) << " (one split "
              << one_split << ") differs from the cluster kernel's";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeLayer,
                         ::testing::Values(LayerCase{8, 2880, 1408, 1, 2}, LayerCase{8, 2880, 1408, 3, 2},
                                           LayerCase{8, 1024, 512, 64, 1}, LayerCase{64, 512, 256, 1000, 8},
                                           LayerCase{256, 512, 128, 33, 8}, LayerCase{256, 512, 128, 1, 8},
                                           LayerCase{8, 1024, 14336, 8, 2},
                                           LayerCase{8, 1024, 512, 64, 2, RouterNorm::kNone,
                                                     Activation::kGeluTanh, 2.0f},
                                           LayerCase{8, 2048, 1024, 5, 2, RouterNorm::kNone,
                                                     Activation::kGelu, 0.0f},
                                           LayerCase{8, 1024, 512, 8192, 2}, LayerCase{8, 2880, 1408, 256, 2}));

}  // namespace
}  // namespace nibble
