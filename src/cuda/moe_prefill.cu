// The MoE prefill path (moe_prefill.h): padded-row layout, expert groups that fit the weight
// scratch, chunks of padded rows that fit the buffers, and per chunk: gather-quantize -> one
// cuBLASLt gate_up GEMM per expert (F32 or BF16) -> scaled SiLU·mul + FP8 quant -> one down GEMM per expert
// (BF16 or F32) into the window's down product; per window of chunks: scaled combine. Each active
// expert is dequantized once a call; the per-expert GEMMs of a chunk run on kPrefillStreams side
// streams.
#include "cuda/moe_prefill.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/env_setting.h"
#include "cuda/launch.h"
#include "cuda/moe.h"
#include "cuda/moe_combine.h"
#include "cuda/moe_dequant.h"
#include "cuda/moe_quantize.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr std::size_t kLtScratchBytes = std::size_t{32} << 20;

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// The most padded rows a call with `rows` routed pairs can have: each active expert pads < 16 rows.
int64_t max_padded_rows(int64_t rows, int64_t experts) {
  return rows + (kPrefillRowQuantum - 1) * std::min(experts, rows);
}

struct PaddedRowsArgs {
  const int32_t* topk_ids;        // (T·K)
  const int32_t* row_pos;         // (T·K) sorted row of each pair
  const int32_t* expert_offsets;  // (E + 1) sorted rows
  const int32_t* padded_offsets;  // (E + 1) padded rows
  int32_t* pair_row;              // (T·K) padded row of each pair
  int32_t* row_token;             // (padded rows), -1 where not written
  int32_t* row_expert;            // (padded rows), -1 where not written
  int64_t pairs;
  int64_t top_k;
};

// One thread per (token, k) pair: its padded row = its rank among its expert's rows + the expert's
// padded offset.
__global__ void padded_rows_kernel(const __grid_constant__ PaddedRowsArgs a) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (i >= a.pairs) return;
  const int32_t e = a.topk_ids[i];
  const int32_t p = a.row_pos[i] - a.expert_offsets[e] + a.padded_offsets[e];
  a.pair_row[i] = p;
  a.row_token[p] = static_cast<int32_t>(i / a.top_k);
  a.row_expert[p] = e;
}

}  // namespace

PrefillPlan plan_prefill(const int32_t* offsets, int64_t E, int64_t slots, int64_t chunk_rows,
                         int64_t window_rows) {
  check(slots >= 1 && chunk_rows >= 1 && chunk_rows % kPrefillRowQuantum == 0 &&
            window_rows >= chunk_rows,
        "plan_prefill: bad scratch sizes");
  PrefillPlan plan;
  std::vector<int32_t>& padded = plan.padded_offsets;
  padded.assign(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) {
    const int32_t count = offsets[e + 1] - offsets[e];
    padded[e + 1] = padded[e] + static_cast<int32_t>(round_up(count, kPrefillRowQuantum));
    if (count > 0) plan.active.push_back(e);
  }
  const auto active = static_cast<int64_t>(plan.active.size());
  for (int64_t g = 0; g * slots < active; ++g) {
    const int64_t first = plan.active[g * slots];
    const int64_t last = plan.active[std::min((g + 1) * slots, active) - 1];
    for (int64_t begin = padded[first]; begin < padded[last + 1]; begin += chunk_rows)
      plan.chunks.push_back({.group = g,
                             .begin = begin,
                             .end = std::min<int64_t>(begin + chunk_rows, padded[last + 1]),
                             .window_begin = begin});
  }
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    if (c > 0 && plan.chunks[c].end - plan.chunks[c - 1].window_begin <= window_rows)
      plan.chunks[c].window_begin = plan.chunks[c - 1].window_begin;
    else
      ++plan.windows;
  }
  return plan;
}

bool moe_prefill_preferred(int64_t tokens, int64_t top_k, int64_t experts) {
  return tokens * top_k >= kPrefillMinRowsPerExpert * experts;
}

MoePrefillWorkspace::MoePrefillWorkspace(int64_t E, int64_t H, int64_t I, int64_t max_tokens,
                                         int64_t K, const PrefillOptions& options) {
  const int64_t rows = max_tokens * K, padded = max_padded_rows(rows, E);
  slots = std::clamp<int64_t>(options.weight_scratch_bytes / (3 * I * H), 1, E);
  const int64_t all_rows = round_up(padded, kPrefillRowQuantum);
  static const std::string gate_up_setting = env_choice("NIBBLE_MOE_GATE_UP_PRODUCT", {"f32", "bf16"});
  const DType gate_up_product = gate_up_setting == "f32"    ? DType::kF32
                                : gate_up_setting == "bf16" ? DType::kBF16
                                                            : options.gate_up_product;
  check(options.down_product == DType::kF32 || options.down_product == DType::kBF16,
        "MoE prefill: the down product must be F32 or BF16");
  check(gate_up_product == DType::kF32 || gate_up_product == DType::kBF16,
        "MoE prefill: the gate_up product must be F32 or BF16");
  // The gate_up product (2I values a row) bounds a chunk; the down product a window.
  const auto gate_up_row_bytes = 2 * I * static_cast<int64_t>(dtype_size(gate_up_product));
  chunk_rows = std::max(kPrefillRowQuantum,
                        options.buffer_bytes / gate_up_row_bytes / kPrefillRowQuantum * kPrefillRowQuantum);
  chunk_rows = std::min(chunk_rows, all_rows);
  const auto down_row_bytes = H * static_cast<int64_t>(dtype_size(options.down_product));
  window_rows = options.down_bytes / down_row_bytes / kPrefillRowQuantum * kPrefillRowQuantum;
  window_rows = std::min(std::max(window_rows, chunk_rows), all_rows);
  gate_up_weights = empty(DType::kF8E4M3, {slots, 2 * I, H});
  down_weights = empty(DType::kF8E4M3, {slots, H, I});
  padded_offsets = empty(DType::kI32, {E + 1});
  row_token = empty(DType::kI32, {padded});
  row_expert = empty(DType::kI32, {padded});
  pair_row = empty(DType::kI32, {rows});
  x_fp8 = empty(DType::kF8E4M3, {chunk_rows, H});
  x_scale = empty(DType::kF32, {chunk_rows});
  sums = empty(DType::kF32, {chunk_rows * std::max(H, I) / 64});
  gate_up = empty(gate_up_product, {chunk_rows, 2 * I});
  act_fp8 = empty(DType::kF8E4M3, {chunk_rows, I});
  act_scale = empty(DType::kF32, {window_rows});
  act_amax = empty(DType::kF32, {chunk_rows});
  down = empty(options.down_product, {window_rows, H});
  if (window_rows < all_rows)
    acc = empty(DType::kF32, {max_tokens, H});  // else one window, no running sums
  lt_scratch = empty(DType::kU8, {kPrefillStreams * static_cast<int64_t>(kLtScratchBytes)});
  cublas_check(cublasLtCreate(&lt));
  for (cudaStream_t& s : streams) cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (cudaEvent_t& e : events) cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cuda_check(cudaMallocHost(&host_offsets, 2 * (E + 1) * sizeof(int32_t)));
  // The buffers come from compute_stream's pool; the side streams may touch them first.
  cuda_check(cudaStreamSynchronize(compute_stream()));
}

MoePrefillWorkspace::~MoePrefillWorkspace() {
  plans.clear();
  for (cudaEvent_t e : events)
    if (e != nullptr) cudaEventDestroy(e);
  for (cudaStream_t s : streams)
    if (s != nullptr) cudaStreamDestroy(s);
  if (lt != nullptr) cublasLtDestroy(lt);
  if (host_offsets != nullptr) cudaFreeHost(host_offsets);
}

LtFp8Gemm& MoePrefillWorkspace::plan(int64_t out_features, int64_t rows, int64_t in_features,
                                     DType product) {
  auto& p = plans[{out_features, rows, in_features, product}];
  if (!p)
    p = std::make_unique<LtFp8Gemm>(lt, out_features, rows, in_features, kLtScratchBytes, product);
  return *p;
}

void moe_prefill(const Tensor& x, const MoeWeightsW4A8& w, const MoeParams& params,
                 MoeWorkspace& ws, Tensor& out, cudaStream_t stream) {
  MoePrefillWorkspace& pf = *ws.prefill;
  const int64_t T = x.dim(0), H = w.hidden_size, I = w.intermediate_size, E = w.num_experts,
                K = params.top_k;
  check(T * K <= pf.pair_row.numel() && pf.padded_offsets.numel() == E + 1 &&
            pf.x_fp8.dim(1) == H && pf.act_fp8.dim(1) == I,
        "moe_prefill: the workspace was made for other sizes");

  // The row count of every expert, on the host: the one synchronization of this eager path (GEMM
  // shapes are host arguments of cuBLASLt).
  int32_t* offsets = pf.host_offsets;
  int32_t* padded = pf.host_offsets + E + 1;
  cuda_check(cudaMemcpyAsync(offsets, ws.expert_offsets.raw(), (E + 1) * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, stream));
  cuda_check(cudaStreamSynchronize(stream));
  const PrefillPlan plan = plan_prefill(offsets, E, pf.slots, pf.chunk_rows, pf.window_rows);
  const std::vector<int64_t>& active = plan.active;
  const std::vector<PrefillChunk>& chunks = plan.chunks;
  std::copy(plan.padded_offsets.begin(), plan.padded_offsets.end(), padded);
  const int64_t total_padded = padded[E];
  check(total_padded <= pf.row_token.numel(), "moe_prefill: ", total_padded,
        " padded rows exceed the workspace");
  cuda_check(cudaMemcpyAsync(pf.padded_offsets.raw(), padded, (E + 1) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream));
  cuda_check(cudaMemsetAsync(pf.row_token.raw(), 0xFF, total_padded * sizeof(int32_t), stream));
  cuda_check(cudaMemsetAsync(pf.row_expert.raw(), 0xFF, total_padded * sizeof(int32_t), stream));
  const PaddedRowsArgs rows_args{.topk_ids = ws.topk_ids.data<int32_t>(),
                                 .row_pos = ws.row_pos.data<int32_t>(),
                                 .expert_offsets = ws.expert_offsets.data<int32_t>(),
                                 .padded_offsets = pf.padded_offsets.data<int32_t>(),
                                 .pair_row = pf.pair_row.data<int32_t>(),
                                 .row_token = pf.row_token.data<int32_t>(),
                                 .row_expert = pf.row_expert.data<int32_t>(),
                                 .pairs = T * K,
                                 .top_k = K};
  launch_kernel(padded_rows_kernel, static_cast<unsigned>((T * K + 255) / 256), 256, 0, stream, rows_args);
  cuda_check(cudaGetLastError());

  int64_t window = 0;  // index of the current chunk's window
  // NIBBLE_MOE_PREFILL_STREAMS (1 to kPrefillStreams) caps the side streams (an experiment).
  static const int side_streams = [] {
    const std::string v = env_choice("NIBBLE_MOE_PREFILL_STREAMS", {"1", "2", "3", "4"});
    return v.empty() ? kPrefillStreams : std::min(kPrefillStreams, std::stoi(v));
  }();

  auto* gate_up_weights = pf.gate_up_weights.data<uint8_t>();
  auto* down_weights = pf.down_weights.data<uint8_t>();
  int64_t loaded_group = -1;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    const PrefillChunk& chunk = chunks[c];
    const auto group_begin = active.begin() + chunk.group * pf.slots;
    const auto group_end = active.begin() + std::min<int64_t>((chunk.group + 1) * pf.slots,
                                                              static_cast<int64_t>(active.size()));
    // A new group's experts -> slots 0.., one launch per run of consecutive ids.
    if (chunk.group != loaded_group) {
      for (auto run = group_begin; run != group_end;) {
        auto run_end = run + 1;
        while (run_end != group_end && *run_end == *(run_end - 1) + 1) ++run_end;
        const int64_t slot = run - group_begin, count = run_end - run;
        dequantize_experts_fp8({.format = w.format,
                                .weights = w.gate_up.raw(),
                                .out = gate_up_weights + slot * 2 * I * H,
                                .first = *run,
                                .count = count,
                                .n = 2 * I,
                                .k = H},
                               stream);
        dequantize_experts_fp8({.format = w.format,
                                .weights = w.down.raw(),
                                .out = down_weights + slot * H * I,
                                .first = *run,
                                .count = count,
                                .n = H,
                                .k = I},
                               stream);
        run = run_end;
      }
      loaded_group = chunk.group;
    }
    const int64_t rows = chunk.end - chunk.begin;
    quantize_rows_fp8({.x = x.raw(),
                       .codes = pf.x_fp8.data<uint8_t>(),
                       .scale = pf.x_scale.data<float>(),
                       .sums = pf.sums.data<float>(),
                       .rows = rows,
                       .cols = H,
                       .src_row = pf.row_token.data<int32_t>() + chunk.begin},
                      stream);
    // Each expert's padded rows inside the chunk: [a, b), a multiple of 16 rows from the chunk
    // start. Its GEMM runs on side stream i % kPrefillStreams (outputs are disjoint), forked from
    // and joined back into `stream`.
    auto for_each_expert = [&](auto gemm) {
      cuda_check(cudaEventRecord(pf.events[0], stream));
      for (int s = 0; s < side_streams; ++s) cuda_check(cudaStreamWaitEvent(pf.streams[s], pf.events[0], 0));
      int i = 0;
      for (auto it = group_begin; it != group_end; ++it) {
        const int64_t e = *it, a = std::max<int64_t>(padded[e], chunk.begin),
                      b = std::min<int64_t>(padded[e + 1], chunk.end);
        if (a >= b) continue;
        const int s = i++ % side_streams;
        gemm(it - group_begin, a - chunk.begin, b - a,
             pf.lt_scratch.data<uint8_t>() + s * kLtScratchBytes, pf.streams[s]);
      }
      for (int s = 0; s < side_streams; ++s) {
        cuda_check(cudaEventRecord(pf.events[1 + s], pf.streams[s]));
        cuda_check(cudaStreamWaitEvent(stream, pf.events[1 + s], 0));
      }
    };
    const bool f32_gate_up = pf.gate_up.dtype() == DType::kF32;
    for_each_expert([&](int64_t slot, int64_t row, int64_t n, void* scratch, cudaStream_t s) {
      pf.plan(2 * I, n, H, pf.gate_up.dtype())
          .run(gate_up_weights + slot * 2 * I * H, pf.x_fp8.data<uint8_t>() + row * H,
               static_cast<char*>(pf.gate_up.raw()) +
                   row * 2 * I * static_cast<int64_t>(dtype_size(pf.gate_up.dtype())),
               1.0f, scratch, s);
    });
    const int64_t in_window = chunk.begin - chunk.window_begin;  // chunk's first row in the window
    activation_quantize_fp8({.gate_up = f32_gate_up ? pf.gate_up.data<float>() : nullptr,
                             .interleaved = true,  // the uploaded rows' order (moe.h)
                             .splits = 1,
                             .max_rows = rows,
                             .codes = pf.act_fp8.data<uint8_t>(),
                             .scale = pf.act_scale.data<float>() + in_window,
                             .sums = pf.sums.data<float>(),
                             .rows = rows,
                             .intermediate = I,
                             .activation = params.activation,
                             .row_scale = pf.x_scale.data<float>(),
                             .channel_scale = w.gate_up_scale.data<float>(),
                             .row_expert = pf.row_expert.data<int32_t>() + chunk.begin,
                             .gate_up_bf16 = f32_gate_up ? nullptr : pf.gate_up.raw()},
                            params.communicator, pf.act_amax, stream);
    for_each_expert([&](int64_t slot, int64_t row, int64_t n, void* scratch, cudaStream_t s) {
      pf.plan(H, n, I, pf.down.dtype())
          .run(down_weights + slot * H * I, pf.act_fp8.data<uint8_t>() + row * I,
               static_cast<char*>(pf.down.raw()) +
                   (in_window + row) * H * static_cast<int64_t>(dtype_size(pf.down.dtype())),
               1.0f, scratch, s);
    });
    if (c + 1 < chunks.size() && chunks[c + 1].window_begin == chunk.window_begin) continue;
    // The window's last chunk: its combine pass.
    const CombinePass pass = plan.windows == 1            ? CombinePass::kOnly
                             : window == 0                ? CombinePass::kFirst
                             : window + 1 == plan.windows ? CombinePass::kLast
                                                          : CombinePass::kMiddle;
    ++window;
    const bool f32_down = pf.down.dtype() == DType::kF32;
    moe_combine_rows({.down = f32_down ? pf.down.data<float>() : nullptr,
                      .down_bf16 = f32_down ? nullptr : pf.down.raw(),
                      .row_scale = pf.act_scale.data<float>(),
                      .channel_scale = w.down_scale.data<float>(),
                      .pair_row = pf.pair_row.data<int32_t>(),
                      .topk_ids = ws.topk_ids.data<int32_t>(),
                      .topk_weights = ws.topk_weights.data<float>(),
                      .acc = pass == CombinePass::kOnly ? nullptr : pf.acc.data<float>(),
                      .out = out.raw(),
                      .out_dtype = out.dtype(),
                      .row_begin = chunk.window_begin,
                      .row_end = chunk.end,
                      .tokens = T,
                      .top_k = K,
                      .hidden = H,
                      .pass = pass},
                     stream);
  }
}

}  // namespace nibble::cuda
