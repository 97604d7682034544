// Tensor parallelism on GPUs (one rank per GPU over NCCL): the tiny Mixtral and Grok-1 at
// --tp-size 2 against the same model on one GPU, bf16 and W4A8, the engine's decode graphs on a
// group against its eager steps, and the failures that must end the run with an error instead of
// a hang. Skips unless 2 GPUs are visible (the GPU-count error runs
// everywhere a CUDA build is).
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "cuda/device.h"
#include "cuda/nccl_communicator.h"
#include "cuda/tp_device_group.h"
#include "engine/engine.h"
#include "gpu_test_util.h"
#include "model/fixture_test_util.h"
#include "model/tensor_parallel.h"

namespace nibble {
namespace {

using test::compare;
using test::Comparison;
using test::expect_error;
using test::full_logits;
using test::prompt_ids;

#define SKIP_WITHOUT_TWO_GPUS() \
  if (::nibble::cuda::device_count() < 2) GTEST_SKIP() << "fewer than 2 CUDA devices"

constexpr char kMixtral[] = "tests/fixtures/tiny-mixtral";
constexpr char kGrok1[] = "tests/fixtures/tiny-grok1";

// The residual stream x and the sublayer outputs y are F32 at every rank count (ops.h): each rank's
// o_proj and MoE partial sum stays F32, NCCL sums F32, and x += y adds the sum unrounded, as one GPU
// adds its own fp32 sum. So tp 2 equals tp 1 up to fp32 summation order, for bf16 and for W4A8
// (whose FP8 row scales come from the amax over the ranks: o_proj's row_group,
// MoeParams::communicator); what is left is where that order moves a value across the BF16 rounding
// of a norm's output, qkv or the attention output. The CPU twin with BF16 activations
// (test_tensor_parallel.cc, Bf16ActivationsWithinRounding) measures 0 for three of the four cases
// and, for Mixtral bf16, 1.5e-3 at the worst position, 2.5e-4 over the whole tensor (was 6.1e-3 /
// 1.9e-3 with a BF16 x). The GPU's GEMMs (FP8 tensor cores with their reduced-precision sums
// included) change their summation order with the shard's shape, so flips can be more frequent than
// on the CPU. Measured on 2×H200 (2026-11-29): bf16 tp 2 equals tp 1 exactly (0) for both fixtures,
// bounded at 3e-3 worst, 1e-3 whole, equal argmax and greedy tokens. W4A8 measured 0.44 worst / 0.096
// whole (Mixtral) and 0.068 / 0.034 (Grok-1): the FP8 tensor cores sum each rank's K slice with
// reduced precision, unlike one GPU's whole-K sum, and that difference moves BF16 and FP8 roundings
// of the next layers' inputs; this random tiny MoE then picks other experts (its GPU run differs from
// its own CPU twin by the same 0.44, test_cuda_model.cc CudaTinyMixtral). So W4A8 is held to what a
// wrong shard or a lost partial would break (whole ≤ 0.15, worst ≤ 0.6), not to equality; the CPU
// backend's W4A8 tp 2 equals tp 1 to 4e-7 (tests/app/test_tp.py). With BF16 partials (each rank's
// rounded, then their sum again) CUDA measured 0.015 (bf16) and up to 0.48 (W4A8) here.
void expect_tp2_matches_one_gpu(const std::string& dir, Quantization q) {
  const std::vector<int32_t> ids = prompt_ids(dir);
  const ModelConfig c = load_model_config(dir);
  cuda::CudaOps gpu;
  Model one(c, load_weights(Checkpoint::open(dir), c, q, gpu), gpu);
  const Tensor ref = full_logits(one, ids, KvCacheDType::kBf16);
  const auto greedy = generate(one, ids, 16, {}, KvCacheDType::kBf16, {});

  CpuOps host;
  const ModelWeights host_weights = load_weights(Checkpoint::open(dir), c, q, host);
  check_tp_size(c, 2, 64);
  const auto tp = cuda::make_cuda_tp_model(c, 2, gpu, [&](int rank, const ModelConfig&, Ops& ops) {
    return place_shard(host_weights, c, rank, 2, ops);
  });
  const Comparison cmp = compare(ref, full_logits(*tp, ids, KvCacheDType::kBf16));
  std::cout << dir << " " << quantization_name(q) << " CUDA --tp-size 2 vs 1: worst relative L2 "
            << cmp.worst << ", mean " << cmp.mean << ", whole " << cmp.whole
            << ", argmax differs at " << cmp.argmax_diff
            << "\n";
  const auto tp_greedy = generate(*tp, ids, 16, {}, KvCacheDType::kBf16, {});
  if (q == Quantization::kNone) {
    EXPECT_LE(cmp.worst, 3e-3);  // the worst position
    EXPECT_LE(cmp.whole, 1e-3);
    EXPECT_EQ(cmp.argmax_diff, 0);
    EXPECT_EQ(tp_greedy, greedy) << "tp 2 greedy " << ::testing::PrintToString(tp_greedy)
                                 << ", one GPU " << ::testing::PrintToString(greedy);
  } else {
    EXPECT_LE(cmp.worst, 0.6);
    EXPECT_LE(cmp.whole, 0.15);
  }
  // A second KV cache and more steps on the same group (persistent rank threads).
  EXPECT_EQ(generate(*tp, ids, 16, {}, KvCacheDType::kBf16, {}), tp_greedy);
}

TEST(CudaTensorParallel, TinyMixtralBf16) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_tp2_matches_one_gpu(kMixtral, Quantization::kNone);
}
TEST(CudaTensorParallel, TinyGrok1Bf16) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_tp2_matches_one_gpu(kGrok1, Quantization::kNone);
}
TEST(CudaTensorParallel, TinyMixtralW4A8) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_tp2_matches_one_gpu(kMixtral, Quantization::kQuarkInt4Fp8Moe);
}
TEST(CudaTensorParallel, TinyGrok1W4A8) {
  SKIP_WITHOUT_TWO_GPUS();
  expect_tp2_matches_one_gpu(kGrok1, Quantization::kQuarkInt4Fp8Moe);
}

// The engine on a tp 2 group: decode steps replayed from every rank's CUDA graph (NCCL all-reduces
// captured inside) give the tokens of eager steps, several requests of different lengths decoding
// together (graph buckets padded with idle rows); W4A8 with FP8 KV cache, as the benchmarks run.
TEST(CudaTensorParallel, EngineGraphsMatchEagerSteps) {
  SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig c = load_model_config(kMixtral);
  CpuOps host;
  const ModelWeights w =
      load_weights(Checkpoint::open(kMixtral), c, Quantization::kQuarkInt4Fp8Moe, host);
  cuda::CudaOps gpu;
  const auto tp = cuda::make_cuda_tp_model(c, 2, gpu, [&](int rank, const ModelConfig&, Ops& ops) {
    return place_shard(w, c, rank, 2, ops);
  });
  auto run = [&](CudaGraphs graphs) {
    Engine engine(*tp, {.num_blocks = 64,
                        .block_size = 16,
                        .kv_dtype = KvCacheDType::kFp8E4M3,
                        .scheduler = {},
                        .cuda_graphs = graphs});
    std::map<int64_t, std::vector<int32_t>> out;
    for (int r = 0; r < 5; ++r) {
      std::vector<int32_t> prompt{1};
      for (int i = 0; i < 3 + 7 * r; ++i) prompt.push_back(300 + (37 * i + 11 * r) % 200);
      engine.add_request(
          prompt,
          {.sampling = {}, .max_tokens = 20 + 3 * r, .stop_token_ids = {}, .ignore_eos = true});
    }
    while (engine.has_unfinished())
      for (const StepOutput& o : engine.step()) out[o.id].push_back(o.token);
    return out;
  };
  const auto eager = run(CudaGraphs::kOff), graphs = run(CudaGraphs::kOn);
  ASSERT_EQ(eager.size(), 5u);
  EXPECT_EQ(graphs, eager);
}

// The NCCL collectives themselves, each rank on its own thread and device: sum (BF16 and F32) and
// max.
TEST(CudaTensorParallel, NcclSumAndMax) {
  SKIP_WITHOUT_TWO_GPUS();
  auto group = std::make_shared<cuda::NcclGroup>(2);
  std::vector<std::vector<float>> sums(2), maxima(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        cuda_check(cudaSetDevice(r));
        cuda::NcclCommunicator comm(group, r, cuda::compute_stream());
        Tensor s = Tensor::zeros(DType::kF32, {3}), m = Tensor::zeros(DType::kF32, {3});
        for (int i = 0; i < 3; ++i) {
          s.data<float>()[i] = static_cast<float>((r + 1) * (i + 1));  // sum: 3, 6, 9
          m.data<float>()[i] =
              r == 0 ? static_cast<float>(i) : 1.5f - static_cast<float>(i);  // max: 1.5, 1, 2
        }
        Tensor ds = cuda::upload(s), dm = cuda::upload(m);
        comm.all_reduce_sum(ds);
        comm.all_reduce_max(dm);
        const Tensor hs = cuda::download(ds), hm = cuda::download(dm);
        sums[r].assign(hs.data<float>(), hs.data<float>() + 3);
        maxima[r].assign(hm.data<float>(), hm.data<float>() + 3);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group->abort();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(sums[r], (std::vector<float>{3, 6, 9})) << "rank " << r;
    EXPECT_EQ(maxima[r], (std::vector<float>{1.5f, 1, 2})) << "rank " << r;
  }
}

// A rank that fails before joining NCCL (as a bad device would): rank 0, already waiting in NCCL
// init, ends with an error too, and the first error (rank 1's) is the one reported.
TEST(CudaTensorParallel, RankFailingBeforeNcclInitEndsTheGroup) {
  SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig c = load_model_config(kMixtral);
  CpuOps host;
  const ModelWeights w = load_weights(Checkpoint::open(kMixtral), c, Quantization::kNone, host);
  cuda::CudaOps gpu;
  auto group = std::make_shared<cuda::NcclGroup>(2);
  const TpSetup setup{
      .size = 2,
      .enter = [](int rank) { cuda_check(cudaSetDevice(rank)); },
      .make_ops = [](int) -> std::unique_ptr<Ops> {
        throw std::runtime_error("rank 1: no such GPU");
      },
      .make_communicator = [group](int rank) -> std::unique_ptr<Communicator> {
        return std::make_unique<cuda::NcclCommunicator>(group, rank, cuda::compute_stream());
      },
      .make_weights = [&](int rank, const ModelConfig&,
                          Ops& ops) { return place_shard(w, c, rank, 2, ops); },
      .synchronize = [](int) { cuda_check(cudaStreamSynchronize(cuda::compute_stream())); },
      .abort = [group] { group->abort(); }};
  expect_error([&] { TensorParallelModel tp(c, setup, gpu); }, "rank 1: no such GPU");
}

// A rank that fails after NCCL init (making its weights): the group ends with its error.
TEST(CudaTensorParallel, RankFailingAfterNcclInitEndsTheGroup) {
  SKIP_WITHOUT_TWO_GPUS();
  const ModelConfig c = load_model_config(kMixtral);
  CpuOps host;
  const ModelWeights w = load_weights(Checkpoint::open(kMixtral), c, Quantization::kNone, host);
  cuda::CudaOps gpu;
  expect_error(
      [&] {
        cuda::make_cuda_tp_model(c, 2, gpu, [&](int rank, const ModelConfig&, Ops& ops) {
          check(rank != 1, "rank 1 ran out of memory");
          return place_shard(w, c, rank, 2, ops);
        });
      },
      "rank 1 ran out of memory");
  // The GPUs are still usable: a fresh group works.
  const auto tp = cuda::make_cuda_tp_model(c, 2, gpu, [&](int rank, const ModelConfig&, Ops& ops) {
    return place_shard(w, c, rank, 2, ops);
  });
  EXPECT_EQ(full_logits(*tp, prompt_ids(kMixtral), KvCacheDType::kBf16).dim(0),
            static_cast<int64_t>(prompt_ids(kMixtral).size()));
}

TEST(CudaTensorParallel, MoreRanksThanGpusFailClearly) {
  const int visible = cuda::device_count();
  expect_error([&] { cuda::check_gpu_count(visible + 1); },
               "--tp-size " + std::to_string(visible + 1) + " needs " +
                   std::to_string(visible + 1) + " GPUs, " + std::to_string(visible) + " visible");
}

}  // namespace
}  // namespace nibble
