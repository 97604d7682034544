// Router logits, softmax top-k, and grouping by expert.
#include <cuda_bf16.h>

#include <cfloat>

#include "cuda/cuda_check.h"
#include "cuda/moe_route.h"

namespace nibble::cuda {
namespace {

constexpr int kLogitWarps = 8;

// Grid (T, E / 8): each warp computes one expert's logit for one token, reading 16 bytes (8 bf16) a
// lane per step with several loads in flight, so that one token alone still spreads over the GPU.
__global__ void router_logits_kernel(const __grid_constant__ RouteArgs p) {
  const int64_t t = blockIdx.x;
  const int64_t e = static_cast<int64_t>(blockIdx.y) * kLogitWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (e >= p.experts) return;
  const auto* x = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.x) + t * p.hidden);
  const auto* w = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p.router) + e * p.hidden);
  float sum = 0.0f;
#pragma unroll 4
  for (int64_t i = lane; i < p.hidden / 8; i += 32) {
    const uint4 xv = x[i], wv = w[i];
    const auto* xh = reinterpret_cast<const __nv_bfloat162*>(&xv);
    const auto* wh = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(xh[j]), b = __bfloat1622float2(wh[j]);
      sum += a.x * b.x + a.y * b.y;
    }
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  if (lane == 0) p.logits[t * p.experts + e] = sum;
}

// One warp per token: optional soft-cap, softmax over E, then K rounds of a warp-wide argmax.
__global__ void topk_kernel(const __grid_constant__ RouteArgs p) {
  constexpr int kPerLane = kMaxExperts / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= p.tokens) return;
  float prob[kPerLane];
  float max_logit = -FLT_MAX;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t e = i * 32 + lane;
    prob[i] = e < p.experts ? p.logits[t * p.experts + e] : -FLT_MAX;
    if (p.softcap > 0.0f && e < p.experts) prob[i] = p.softcap * tanhf(prob[i] / p.softcap);
    max_logit = fmaxf(max_logit, prob[i]);
  }
  for (int o = 16; o > 0; o /= 2) max_logit = fmaxf(max_logit, __shfl_xor_sync(0xFFFFFFFFu, max_logit, o));
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    prob[i] = i * 32 + lane < p.experts ? expf(prob[i] - max_logit) : 0.0f;
    sum += prob[i];
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) prob[i] = i * 32 + lane < p.experts ? prob[i] / sum : -1.0f;

  float chosen_sum = 0.0f;
  float my_weight = 0.0f;  // lane k keeps the k-th weight
  int my_id = 0;
  for (int k = 0; k < p.top_k; ++k) {
    float best = -1.0f;
    int best_id = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (prob[i] > best) best = prob[i], best_id = i * 32 + lane;  // lowest id wins within a lane
    for (int o = 16; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int other_id = __shfl_xor_sync(0xFFFFFFFFu, best_id, o);
      if (other > best || (other == best && other_id < best_id)) best = other, best_id = other_id;
    }
    if (best_id % 32 == lane) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (i == best_id / 32) prob[i] = -2.0f;  // taken
    }
    if (lane == k) my_weight = best, my_id = best_id;
    chosen_sum += best;
  }
  if (lane < p.top_k) {
    p.topk_ids[t * p.top_k + lane] = my_id;
    p.topk_weights[t * p.top_k + lane] = p.norm == RouterNorm::kRenormalize ? my_weight / chosen_sum : my_weight;
  }
}

constexpr int kGroupThreads = 1024;

// One block: counts, offsets and the active list, then each pair's sorted position.
__global__ void __launch_bounds__(kGroupThreads) group_kernel(const __grid_constant__ GroupArgs p) {
  __shared__ int counts[kMaxExperts];
  __shared__ int cursor[kMaxExperts];
  const int64_t pairs = p.tokens * p.top_k;
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&counts[p.topk_ids[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int offset = 0, active = 0;
    for (int e = 0; e < p.experts; ++e) {
      p.expert_offsets[e] = offset;
      cursor[e] = offset;
      if (counts[e] > 0) p.active_experts[active++] = e;
      offset += counts[e];
    }
    p.expert_offsets[p.experts] = offset;
    p.active_experts[p.experts] = active;
  }
  __syncthreads();
  // The order of rows within an expert varies between runs; no result depends on it.
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int pos = atomicAdd(&cursor[p.topk_ids[i]], 1);
    p.sorted_tokens[pos] = static_cast<int32_t>(i / p.top_k);
    p.row_pos[i] = pos;
  }
}

}  // namespace

void route_topk(const RouteArgs& p, cudaStream_t stream) {
  check(p.experts >= 1 && p.experts <= kMaxExperts, "route_topk: ", p.experts, " experts (at most ", kMaxExperts, ")");
  check(p.top_k >= 1 && p.top_k <= kMaxTopK && p.top_k <= p.experts, "route_topk: top_k ", p.top_k);
  if (p.tokens == 0) return;
  check(p.hidden % 8 == 0, "route_topk: hidden size ", p.hidden, " is not a multiple of 8");
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>((p.experts + kLogitWarps - 1) / kLogitWarps));
  router_logits_kernel<<<grid, kLogitWarps * 32, 0, stream>>>(p);
  cuda_check(cudaGetLastError());
  constexpr int kWarpsPerBlock = 4;
  topk_kernel<<<static_cast<unsigned>((p.tokens + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                stream>>>(p);
  cuda_check(cudaGetLastError());
}

void group_by_expert(const GroupArgs& p, cudaStream_t stream) {
  check(p.experts >= 1 && p.experts <= kMaxExperts, "group_by_expert: ", p.experts, " experts");
  group_kernel<<<1, kGroupThreads, 0, stream>>>(p);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
