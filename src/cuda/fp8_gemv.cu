// The few-token FP8 linear (fp8_gemv.h). One block an SM (grid: the SMs, or fewer groups) takes a
// contiguous range of groups of kGroupRows output channels (8 consumer warps × kRows rows). A producer
// warp streams the weights through a ring of 16 KB shared-memory stages, a stage being the group's
// rows over one kSlice-wide piece of K, one bulk copy a row, all completing on the stage's mbarrier.
// The weights are constant, so the producer never waits for the kernel before: the ring fills (up to
// 128 KB an SM) while that kernel finishes. The consumers wait for it, quantize x's rows into shared
// memory (as quantize_rows_kernel: the same scale and codes; every block does it) as the codes' fp32
// values, laid out so that the 32 lanes' reads of one chunk's four 16-byte quarters are each one
// contiguous 512 bytes (no bank conflicts), then take the stages in turn: each warp its kRows rows,
// a lane 16-byte chunks of them, the slot handed back once its chunks are in registers.
#include "cuda/fp8_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/kernel_attributes.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 32;  // and the producer warp
constexpr int kStageBytes = 16 * 1024;
constexpr int kMaxStages = 8;
// The rows a consumer warp takes of a stage unless Fp8GemvArgs or NIBBLE_GEMV_ROWS say (1, 2 or 4): 8
// rows a stage over 2048 bytes of K, 16 over 1024, or 32 over 512.
constexpr int kDefaultRows = 2;
// Ring stages a block (NIBBLE_GEMV_STAGES, at most kMaxStages and what shared memory holds) and blocks
// an SM (NIBBLE_GEMV_BLOCKS_PER_SM: the grid) unless the environment says (tuning).
constexpr int kDefaultStages = 8;
constexpr int kDefaultBlocksPerSm = 1;
template <int kRows>
constexpr int kSlice = kStageBytes / (kConsumerWarps * kRows);  // bytes of K a stage
template <int kRows>
constexpr int kLaneChunks = kSlice<kRows> / 512;  // 16-byte chunks a lane takes of a row a stage
// x's quantized rows in shared memory, at most (fp8_gemv_supported); the stages take the rest.
constexpr int64_t kMaxSmemBytes = 160 * 1024;

// Floats of shared memory a token: K rounded up to whole tiles of 32 chunks (512 values).
__host__ __device__ inline int64_t padded_k(int64_t k) { return (k / 16 + 31) / 32 * 32 * 16; }

// Where value k of a token sits: chunk c = k / 16 of tile c / 32, quarter q = k % 16 / 4; the
// quarters q of a tile's 32 chunks are 32 consecutive float4.
__device__ inline int64_t xq_index(int64_t k) {
  const int64_t c = k / 16;
  return ((c / 32) * 4 + (k % 16) / 4) * 128 + (c % 32) * 4 + k % 4;
}

// 16 FP8 e4m3 codes as fp32 values (exact).
__device__ inline void decode16(const uint4 w, float (&f)[16]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>(words[i] >> (16 * h));
      const float2 v = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[4 * i + 2 * h] = v.x;
      f[4 * i + 2 * h + 1] = v.y;
    }
  }
}

// x's rows quantized into xq (the consumers, after the grid dependency wait): each row's amax (or the
// given scale), then its codes' values; scale[t] the row's scale.
template <int kTokens>
__device__ void quantize_x(const Fp8GemvArgs& p, float* xq, float (&partial)[kConsumerWarps][kTokens],
                           float (&scale)[kTokens]) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t kp = padded_k(p.k);
  const auto* x = static_cast<const __nv_bfloat16*>(p.x);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float amax = 0.0f;
    for (int64_t k = threadIdx.x * 8; k < p.k; k += kConsumers * 8) {
      const uint4 raw = *reinterpret_cast<const uint4*>(x + t * p.k + k);
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      float v[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // a BF16 is the upper half of its fp32 value
        v[2 * j] = __uint_as_float(words[j] << 16);
        v[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
      *reinterpret_cast<float4*>(xq + t * kp + xq_index(k)) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(xq + t * kp + xq_index(k + 4)) = make_float4(v[4], v[5], v[6], v[7]);
    }
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    if (lane == 0) partial[warp][t] = amax;
  }
  ptx::named_barrier_sync(1, kConsumers);
  if (threadIdx.x < kTokens) {
    const int t = static_cast<int>(threadIdx.x);
    float amax = 0.0f;
    for (int i = 0; i < kConsumerWarps; ++i) amax = fmaxf(amax, partial[i][t]);
    scale[t] = p.amax_in != nullptr     ? fmaxf(p.amax_in[t], 1e-12f) / 448.0f
               : p.static_scale > 0.0f ? p.static_scale
                                       : fmaxf(amax, 1e-12f) / 448.0f;
  }
  ptx::named_barrier_sync(1, kConsumers);
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    for (int64_t k = threadIdx.x; k < p.k; k += kConsumers) {
      float& v = xq[t * kp + xq_index(k)];
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v / scale[t], __NV_SATFINITE, __NV_E4M3);
      v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
    }
  ptx::named_barrier_sync(1, kConsumers);
}

template <int kTokens, int kRows>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(const __grid_constant__ Fp8GemvArgs p, int stages) {
  constexpr int kGroupRows = kConsumerWarps * kRows;
  constexpr int kSliceBytes = kSlice<kRows>, kSliceChunks = kSliceBytes / 16;
  extern __shared__ float4 smem[];
  auto* xq = reinterpret_cast<float*>(smem);  // (kTokens, padded K)
  const int64_t kp = padded_k(p.k);
  auto* ring = reinterpret_cast<uint8_t*>(xq + kTokens * kp);  // (stages, kStageBytes)
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages];
  __shared__ float partial[kConsumerWarps][kTokens];
  __shared__ float scale[kTokens];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t groups = (p.n + kGroupRows - 1) / kGroupRows;
  const int64_t group_begin = groups * blockIdx.x / gridDim.x, group_end = groups * (blockIdx.x + 1) / gridDim.x;
  const int slices = static_cast<int>((p.k + kSliceBytes - 1) / kSliceBytes);
  const int64_t steps = (group_end - group_begin) * slices;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::mbarrier_init(&full[s], 1);                // the producer's arrival with its bytes
      ptx::mbarrier_init(&empty[s], kConsumerWarps);  // each consumer warp's
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == kConsumerWarps) {  // the producer: constant weights, so no grid dependency wait
    for (int64_t step = 0; step < steps; ++step) {
      const int slot = static_cast<int>(step % stages);
      if (step >= stages) ptx::mbarrier_wait(&empty[slot], static_cast<uint32_t>((step / stages - 1) & 1));
      const int64_t row0 = (group_begin + step / slices) * kGroupRows;
      const int64_t k0 = (step % slices) * int64_t{kSliceBytes};
      const int rows = static_cast<int>(min(int64_t{kGroupRows}, p.n - row0));
      const auto bytes = static_cast<uint32_t>(min(int64_t{kSliceBytes}, p.k - k0));
      if (lane == 0) ptx::mbarrier_arrive_expect_tx(&full[slot], bytes * rows);
      __syncwarp();
      if (lane < rows)
        ptx::bulk_copy_to_shared(ring + slot * kStageBytes + lane * kSliceBytes, p.w + (row0 + lane) * p.k + k0,
                                 bytes, &full[slot]);
    }
    return;
  }

  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  quantize_x<kTokens>(p, xq, partial, scale);

  float acc[kRows][kTokens] = {};
  for (int64_t step = 0; step < steps; ++step) {
    const int slot = static_cast<int>(step % stages);
    const int slice = static_cast<int>(step % slices);
    const int64_t c0 = slice * int64_t{kSliceChunks};  // the slice's first chunk of K
    const int chunks = static_cast<int>(min(int64_t{kSliceChunks}, p.k / 16 - c0));
    ptx::mbarrier_wait(&full[slot], static_cast<uint32_t>((step / stages) & 1));
    const auto* stage = reinterpret_cast<const uint4*>(ring + slot * kStageBytes);
    uint4 w[kRows][kLaneChunks<kRows>];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kLaneChunks<kRows>; ++i) {
        const int c = lane + 32 * i;
        w[r][i] = c < chunks ? stage[(warp * kRows + r) * kSliceChunks + c] : make_uint4(0, 0, 0, 0);
      }
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(&empty[slot]);
#pragma unroll
    for (int i = 0; i < kLaneChunks<kRows>; ++i) {
      const int64_t c = c0 + lane + 32 * i;
      if (lane + 32 * i >= chunks) continue;  // zero weights there; the shared memory past K is not written
      const auto* quarters = reinterpret_cast<const float4*>(xq) + (c / 32) * 4 * 32 + c % 32;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[16];
        decode16(w[r][i], wf);
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float4 xv = quarters[t * kp / 4 + q * 32];
            acc[r][t] = fmaf(wf[4 * q], xv.x, acc[r][t]);
            acc[r][t] = fmaf(wf[4 * q + 1], xv.y, acc[r][t]);
            acc[r][t] = fmaf(wf[4 * q + 2], xv.z, acc[r][t]);
            acc[r][t] = fmaf(wf[4 * q + 3], xv.w, acc[r][t]);
          }
      }
    }
    if (slice != slices - 1) continue;
    // The group's last slice: this warp's rows are summed.
    const int64_t n0 = (group_begin + step / slices) * kGroupRows + warp * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        float sum = acc[r][t];
        acc[r][t] = 0.0f;
        for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
        const int64_t n = n0 + r;
        if (lane != 0 || n >= p.n) continue;
        const float y = sum * scale[t] * p.w_scale[n];  // in the scaling pass's order (linear.cu)
        if (p.out_f32)
          static_cast<float*>(p.out)[t * p.n + n] = y;
        else
          static_cast<__nv_bfloat16*>(p.out)[t * p.n + n] = __float2bfloat16_rn(y);
      }
  }
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

template <int kTokens, int kRows>
void launch_rows(const Fp8GemvArgs& p, cudaStream_t stream) {
  static const int smem_limit = [] {
    int device = 0, bytes = 0;
    cuda_check(cudaGetDevice(&device));
    cuda_check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes - 2048;  // the kernel's static shared memory
  }();
  const int64_t xq_bytes = kTokens * padded_k(p.k) * static_cast<int64_t>(sizeof(float));
  static const int stages_wanted = std::clamp(env_int("NIBBLE_GEMV_STAGES", kDefaultStages), 2, kMaxStages);
  static const int blocks_per_sm = std::clamp(env_int("NIBBLE_GEMV_BLOCKS_PER_SM", kDefaultBlocksPerSm), 1, 4);
  const int stages = static_cast<int>(std::min<int64_t>(stages_wanted, (smem_limit - xq_bytes) / kStageBytes));
  check(stages >= 2, "fp8_gemv: K ", p.k, " leaves shared memory for ", stages, " stages");
  const auto smem = static_cast<int>(xq_bytes + int64_t{stages} * kStageBytes);
  auto* kernel = fp8_gemv_kernel<kTokens, kRows>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem_limit);  // once per kernel and device
  const int64_t groups = (p.n + kConsumerWarps * kRows - 1) / (kConsumerWarps * kRows);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(groups, int64_t{blocks_per_sm} * multiprocessor_count()));
  launch_kernel(kernel, blocks, kThreads, smem, stream, p, stages);
  cuda_check(cudaGetLastError());
}

template <int kTokens>
void launch(const Fp8GemvArgs& p, cudaStream_t stream) {
  static const int setting = [] {
    const int rows = env_int("NIBBLE_GEMV_ROWS", kDefaultRows);
    check(rows == 1 || rows == 2 || rows == 4, "NIBBLE_GEMV_ROWS must be 1, 2 or 4, not ", rows);
    return rows;
  }();
  const int rows = p.rows_per_warp > 0 ? p.rows_per_warp : setting;
  check(rows == 1 || rows == 2 || rows == 4, "fp8_gemv: ", rows, " rows a warp (1, 2 or 4)");
  if (rows == 1) return launch_rows<kTokens, 1>(p, stream);
  if (rows == 4) return launch_rows<kTokens, 4>(p, stream);
  launch_rows<kTokens, 2>(p, stream);
}

}  // namespace

bool fp8_gemv_supported(int64_t tokens, int64_t k) {
  return tokens >= 1 && tokens <= kFp8GemvMaxTokens && k % 16 == 0 &&
         tokens * padded_k(k) * static_cast<int64_t>(sizeof(float)) <= kMaxSmemBytes;
}

void fp8_gemv(const Fp8GemvArgs& p, cudaStream_t stream) {
  check(fp8_gemv_supported(p.tokens, p.k) && p.n >= 1, "fp8_gemv: ", p.tokens, " tokens, K ", p.k,
        " are not supported");
  check(reinterpret_cast<std::uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0,
        "fp8_gemv: the weights or x are not 16-byte aligned");
  switch (p.tokens) {
    case 1: return launch<1>(p, stream);
    case 2: return launch<2>(p, stream);
    case 3: return launch<3>(p, stream);
    default: return launch<4>(p, stream);
  }
}

}  // namespace nibble::cuda
