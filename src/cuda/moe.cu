// The W4A8 (or W8A8) MoE layer: weights upload, workspace, and the sequence of kernels (moe.h).
#include "cuda/moe.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/env_setting.h"
#include "cuda/lt_fp8_gemm.h"
#include "cuda/moe_combine.h"
#include "cuda/moe_gemm_w4a8.h"
#include "cuda/moe_prefill.h"
#include "cuda/moe_quantize.h"
#include "cuda/moe_route.h"
#include "model/communicator.h"

namespace nibble::cuda {
namespace {

// The most floats a split GEMM output needs over every token count up to max_tokens.
int64_t max_split_rows(int64_t n, int64_t k, int64_t experts, int64_t top_k, int64_t max_tokens, int sms) {
  int64_t most = 0;
  for (int64_t t = 1; t <= max_tokens; ++t) {
    const int64_t rows = t * top_k;
    most = std::max(most, choose_k_splits(n, k, std::min(experts, rows), rows, sms) * rows);
  }
  return most;
}

// Rows (E, 2I, ...) of gate_up, gate [0, I) then up [I, 2I), interleaved by kGluRows (moe_gemm_w4a8.h): a
// device copy.
Tensor interleave_gate_up(const Tensor& t) {
  const int64_t E = t.dim(0), rows = t.dim(1), I = rows / 2;
  check(rows % (2 * kGluRows) == 0, "interleave_gate_up: ", rows, " rows");
  const auto row_bytes = static_cast<std::size_t>(t.nbytes() / (E * rows));
  Tensor out = empty(t.dtype(), t.shape());
  const auto* src = static_cast<const uint8_t*>(t.raw());
  auto* dst = static_cast<uint8_t*>(out.raw());
  const std::size_t piece = kGluRows * row_bytes;  // 8 rows
  for (int64_t e = 0; e < E; ++e)
    for (int64_t half = 0; half < 2; ++half)  // gate pieces to tiles' first halves, up to their second
      cuda_check(cudaMemcpy2DAsync(dst + (e * rows) * row_bytes + half * piece, 2 * piece,
                                   src + (e * rows + half * I) * row_bytes, piece, piece,
                                   static_cast<std::size_t>(I / kGluRows), cudaMemcpyDeviceToDevice, compute_stream()));
  return out;
}

// NIBBLE_MOE_FUSED_GLU=0 keeps the activation in its own kernel (MoeWorkspace::fuse_activation).
bool fused_glu_setting() {
  static const bool on = env_choice("NIBBLE_MOE_FUSED_GLU", {"0", "1"}) != "0";
  return on;
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// NIBBLE_MOE_PATH=decode keeps every call on the decode path (an experiment: exactness questions, the
// decode kernels at prefill sizes); unset or auto, the path goes by size.
bool decode_path_forced() {
  static const bool forced = env_choice("NIBBLE_MOE_PATH", {"auto", "decode"}) == "decode";
  return forced;
}

// NIBBLE_ROUTER_LOGITS=kernel keeps the router logits of every call on the CUDA-core kernels (an A/B);
// unset or auto, calls of kTensorLogitsMinTokens tokens or more take them from cuBLAS (RouteArgs::blas).
bool tensor_router_logits() {
  static const bool on = env_choice("NIBBLE_ROUTER_LOGITS", {"auto", "kernel"}) != "kernel";
  return on;
}

// The prefill path synchronizes with the host, so a CUDA graph (decode) always keeps the decode path.
bool takes_prefill_path(MoePath path, int64_t tokens, int64_t top_k, int64_t experts, cudaStream_t stream) {
  if (path == MoePath::kAuto && decode_path_forced()) return false;
  switch (path) {
    case MoePath::kDecode:
      return false;
    case MoePath::kPrefill:
      check(!capturing(stream), "moe_w4a8: the prefill path cannot run inside a CUDA graph capture");
      return true;
    case MoePath::kAuto:
      break;
  }
  return moe_prefill_preferred(tokens, top_k, experts) && !capturing(stream);
}

}  // namespace

MoeWeightsW4A8 upload_moe_w4a8(const MoeWeights& host) {
  const Experts& ex = host.experts;
  check(ex.format == WeightFormat::kInt4 || ex.format == WeightFormat::kFp8, "upload_moe_w4a8: experts are ",
        weight_format_name(ex.format), ", not INT4 or FP8");
  const bool fp8 = ex.format == WeightFormat::kFp8;
  // Repacks a device tensor of codes into the GEMM's layout.
  auto repack = [&](const Tensor& t) { return fp8 ? repack_fp8_for_gemm_gpu(t) : repack_int4_for_gemm_gpu(t); };
  const int64_t E = ex.num_experts, H = ex.hidden_size, I = ex.intermediate_size;
  check(H % 64 == 0 && I % 64 == 0, "the W4A8 MoE kernels need hidden (", H, ") and expert intermediate (", I,
        ") sizes that are multiples of 64");
  return {.format = fp8 ? ExpertWeightFormat::kFp8 : ExpertWeightFormat::kInt4,
          .num_experts = E,
          .hidden_size = H,
          .intermediate_size = I,
          .gate_up = repack(interleave_gate_up(upload(ex.gate_up))),
          .gate_up_scale = interleave_gate_up(upload(ex.gate_up_scale)),
          .down = repack(upload(ex.down)),
          .down_scale = upload(ex.down_scale),
          .router = upload(host.router)};
}

MoeWorkspace::MoeWorkspace(const MoeWeightsW4A8& w, int64_t tokens, int64_t k, PrefillOptions options)
    : max_tokens(tokens), top_k(k), num_sms(multiprocessor_count()), fuse_activation(fused_glu_setting()),
      glu_amax(env_switch("NIBBLE_MOE_GLU_AMAX")),
      prefill_options(options) {
  const int64_t E = w.num_experts, H = w.hidden_size, I = w.intermediate_size, rows = tokens * k;
  check(tokens >= 1 && k >= 1 && k <= E, "MoeWorkspace: bad sizes");
  if (tokens >= kTensorLogitsMinTokens) cublas_check(cublasCreate(&blas));
  router_logits = empty(DType::kF32, {tokens, E});
  topk_ids = empty(DType::kI32, {tokens, k});
  topk_weights = empty(DType::kF32, {tokens, k});
  expert_offsets = empty(DType::kI32, {E + 1});
  active_experts = empty(DType::kI32, {E + 1});
  sorted_tokens = empty(DType::kI32, {rows});
  row_pos = empty(DType::kI32, {rows});
  route_done = empty(DType::kI32, {kRouteCounters});
  cuda_check(cudaMemsetAsync(route_done.raw(), 0, kRouteCounters * sizeof(int32_t), compute_stream()));
  x_fp8 = empty(DType::kF8E4M3, {tokens, H});
  x_sorted = empty(DType::kF8E4M3, {rows, H});
  x_scale = empty(DType::kF32, {tokens});
  x_sums = empty(DType::kF32, {tokens, H / 64});
  gate_up_out = empty(DType::kF32, {max_split_rows(2 * I, H, E, k, tokens, num_sms) * 2 * I});
  act_fp8 = empty(DType::kF8E4M3, {rows, I});
  act_scale = empty(DType::kF32, {rows});
  act_amax = empty(DType::kF32, {rows});
  // The fused activation takes at most 8 rows an expert (moe_gemm_w4a8_fuses_glu).
  glu_part_amax = empty(DType::kF32, {std::min(rows, 8 * E), I / 8});
  act_sums = empty(DType::kF32, {rows, I / 64});
  down_out = empty(DType::kF32, {max_split_rows(H, I, E, k, tokens, num_sms) * H});
  // Not while a decode graph is being captured (the prefill workspace makes streams, pinned memory and a
  // cuBLASLt handle); the first prefill call makes it then.
  if (moe_prefill_preferred(tokens, k, E) && !capturing(compute_stream()))
    prefill = std::make_unique<MoePrefillWorkspace>(E, H, I, tokens, k, prefill_options);
}

MoeWorkspace::~MoeWorkspace() {
  if (blas != nullptr) cublasDestroy(blas);
}

bool moe_w4a8_fuses_activation(const MoeWeightsW4A8& w, const MoeWorkspace& ws, int64_t tokens, int64_t top_k) {
  const int64_t rows = tokens * top_k;
  return ws.fuse_activation && moe_gemm_w4a8_fuses_glu(w.format, rows, std::min(w.num_experts, rows));
}

void moe_w4a8(const Tensor& x, const MoeWeightsW4A8& w, const MoeParams& params, MoeWorkspace& ws, Tensor& out,
              cudaStream_t stream, MoePath path) {
  const int64_t T = x.dim(0), H = w.hidden_size, I = w.intermediate_size, E = w.num_experts, K = params.top_k;
  expect(x, DType::kBF16, {-1, H}, "moe_w4a8 input");
  check(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "moe_w4a8 output ", out.describe(),
        " is not BF16 or F32");
  expect(out, out.dtype(), {T, H}, "moe_w4a8 output");
  check(T <= ws.max_tokens && K == ws.top_k, "moe_w4a8: ", T, " tokens, top-k ", K, " do not fit a workspace for ",
        ws.max_tokens, " tokens, top-k ", ws.top_k);
  if (T == 0) return;
  const int64_t rows = T * K, slots = std::min(E, rows);
  // The activation in gate_up's epilogue (one K split) where the GEMM takes it.
  const bool fuse = moe_w4a8_fuses_activation(w, ws, T, K);
  const int64_t gate_up_splits = fuse                   ? 1
                                 : ws.gate_up_splits > 0 ? ws.gate_up_splits
                                                         : choose_k_splits(2 * I, H, slots, rows, ws.num_sms);
  const RouteArgs route{.x = x.raw(), .router = w.router.raw(), .logits = ws.router_logits.data<float>(),
                        .topk_ids = ws.topk_ids.data<int32_t>(), .topk_weights = ws.topk_weights.data<float>(),
                        .tokens = T, .hidden = H, .experts = E, .top_k = K, .norm = params.router_norm,
                        .softcap = params.router_softcap,
                        .blas = tensor_router_logits() ? ws.blas : nullptr};
  const GroupArgs group{.topk_ids = ws.topk_ids.data<int32_t>(), .expert_offsets = ws.expert_offsets.data<int32_t>(),
                        .active_experts = ws.active_experts.data<int32_t>(),
                        .sorted_tokens = ws.sorted_tokens.data<int32_t>(), .row_pos = ws.row_pos.data<int32_t>(),
                        .tokens = T, .experts = E, .top_k = K,
                        .blocks_done = reinterpret_cast<uint32_t*>(ws.route_done.data<int32_t>())};
  if (takes_prefill_path(path, T, K, E, stream)) {
    route_and_group(route, group, stream);
    if (!ws.prefill) ws.prefill = std::make_unique<MoePrefillWorkspace>(E, H, I, ws.max_tokens, K, ws.prefill_options);
    return moe_prefill(x, w, params, ws, out, stream);
  }
  // x to FP8 for gate_up. Its wgmma tiles read x in routed order, which the routing must settle first;
  // its mma.sync tiles read through sorted_tokens, so the routing launch can quantize too. A lone
  // token's routed copies inside the routing launch (its K rows are sorted rows 0 .. K - 1 before the
  // grouping) were slower, the routing then being gate_up's last launch, so gate_up's weights waited
  // for it: measured on an H100 (bench/RESULTS.md, thirty-eighth session, the layer at one token, µs),
  // Mixtral 81.7, 81.5 against 80.7, 80.6, DeepSeek-V3 104.6, 104.4 against 99.6, 99.4.
  const bool sorted = moe_gemm_w4a8_reads_sorted(w.format, rows, slots);
  bool routed_last = false;  // the routing is the launch just before gate_up's, not two back
  const QuantizeRowsArgs quantize{.x = x.raw(), .codes = ws.x_fp8.data<uint8_t>(), .scale = ws.x_scale.data<float>(),
                                  .sums = ws.x_sums.data<float>(), .rows = T, .cols = H,
                                  .sorted_codes = sorted ? ws.x_sorted.data<uint8_t>() : nullptr,
                                  .row_pos = ws.row_pos.data<int32_t>(), .top_k = K};
  if (sorted) {
    route_and_group(route, group, stream);
    quantize_rows_fp8(quantize, stream);
  } else {
    routed_last = route_and_group(route, group, stream, &quantize);
  }
  // Fused, gate_up_out holds act(gate) · up (rows, I), which the activation kernels only quantize;
  // with glu_amax, the rows' amax in parts from the same epilogue, where the cluster kernel takes the
  // rows and one rank (or each rank alone) quantizes them.
  ActivationArgs activation{.gate_up = ws.gate_up_out.data<float>(), .interleaved = !fuse, .splits = gate_up_splits,
                            .max_rows = rows, .codes = ws.act_fp8.data<uint8_t>(), .scale = ws.act_scale.data<float>(),
                            .sums = ws.act_sums.data<float>(), .rows = rows, .intermediate = I,
                            .activation = params.activation, .activated = fuse};
  if (fuse && ws.glu_amax && (params.communicator == nullptr || tp_local_amax()) &&
      rows <= ws.glu_part_amax.dim(0) && activation_takes_cluster_kernel(activation)) {
    activation.part_amax = ws.glu_part_amax.data<float>();
    activation.amax_parts = I / 8;
  }
  moe_gemm_w4a8({.weight_format = w.format, .weights = w.gate_up.raw(), .weight_scale = w.gate_up_scale.data<float>(),
                 .act = ws.x_fp8.data<uint8_t>(), .act_scale = ws.x_scale.data<float>(),
                 .act_sums = ws.x_sums.data<float>(), .act_row = ws.sorted_tokens.data<int32_t>(),
                 .act_sorted = ws.x_sorted.data<uint8_t>(),
                 .expert_offsets = ws.expert_offsets.data<int32_t>(),
                 .active_experts = ws.active_experts.data<int32_t>(), .out = ws.gate_up_out.data<float>(),
                 .max_rows = rows, .num_experts = E, .n = 2 * I, .k = H, .expert_slots = slots,
                 .splits = gate_up_splits, .glu = fuse, .glu_activation = params.activation,
                 .glu_amax = activation.part_amax != nullptr ? ws.glu_part_amax.data<float>() : nullptr,
                 .routing_settled = !routed_last},
                stream);
  activation_quantize_fp8(activation, params.communicator, ws.act_amax, stream);
  const int64_t down_splits = choose_k_splits(H, I, slots, rows, ws.num_sms);
  moe_gemm_w4a8({.weight_format = w.format, .weights = w.down.raw(), .weight_scale = w.down_scale.data<float>(),
                 .act = ws.act_fp8.data<uint8_t>(), .act_scale = ws.act_scale.data<float>(),
                 .act_sums = ws.act_sums.data<float>(), .act_row = nullptr,
                 .expert_offsets = ws.expert_offsets.data<int32_t>(),
                 .active_experts = ws.active_experts.data<int32_t>(), .out = ws.down_out.data<float>(),
                 .max_rows = rows, .num_experts = E, .n = H, .k = I, .expert_slots = slots, .splits = down_splits,
                 .routing_settled = true},
                stream);
  moe_combine({.down = ws.down_out.data<float>(), .row_pos = ws.row_pos.data<int32_t>(),
               .topk_weights = ws.topk_weights.data<float>(), .out = out.raw(), .out_dtype = out.dtype(),
               .tokens = T, .top_k = K, .hidden = H, .splits = down_splits, .max_rows = rows},
              stream);
}

}  // namespace nibble::cuda
