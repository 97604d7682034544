// The few-token FP8 linear (fp8_gemv.h). A warp takes kRows output channels (2 or 4); a lane holds
// 16-byte chunks of every row's weights (16 / kRows a row up to two tokens, half that above: the
// accumulators' registers), the first tile of them loaded before the grid dependency wait and the
// rest of the rows asked of L2 then, so that the weights stream while the kernel before finishes.
// Every block quantizes x's rows itself (as quantize_rows_kernel: the same scale and codes) into
// shared memory as the codes' fp32 values, laid out so that the 32 lanes' reads of one chunk's four
// 16-byte quarters are each one contiguous 512 bytes (no bank conflicts).
#include "cuda/fp8_gemv.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"
#include "cuda/kernel_attributes.h"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// The rows a warp takes unless Fp8GemvArgs or NIBBLE_GEMV_ROWS say (2 or 4). Measured on an H200
// (bench/RESULTS.md, 2026-11-30): 4 rows took the linears alone faster (CudaOpsTwin.Fp8LinearTiming,
// one token, µs a call, 2 / 4 rows: Mixtral qkv 9.97 / 8.46, o 6.70 / 6.47; Grok-1 qkv 18.0 / 13.8,
// o 13.8 / 11.6), but Mixtral-8x7B W4A8 decode at batch 1 took 3.82 ms a step with 4 against 3.74
// with 2, where the first wave of blocks holds whole rows before the grid dependency wait.
constexpr int kDefaultRows = 2;
// 16-byte weight chunks a lane holds of each of its kRows rows.
template <int kTokens, int kRows>
constexpr int kChunks = (kTokens <= 2 ? 16 : 8) / kRows;
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

template <int kTokens, int kRows>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(const __grid_constant__ Fp8GemvArgs p, bool trigger_first) {
  constexpr int kTile = kChunks<kTokens, kRows>;
  extern __shared__ float4 smem[];
  auto* xq = reinterpret_cast<float*>(smem);  // (kTokens, padded K)
  __shared__ float partial[kWarps][kTokens];
  __shared__ float scale[kTokens];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int64_t chunks = p.k / 16, kp = padded_k(p.k);
  const int64_t n0 = (int64_t{blockIdx.x} * kWarps + warp) * kRows;
  const uint4* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    rows[r] = reinterpret_cast<const uint4*>(p.w + min(n0 + r, p.n - 1) * p.k);
  uint4 w[kRows][kTile];
  auto load_tile = [&](int64_t base) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kTile; ++i) {
        const int64_t c = base + i * 32 + lane;
        w[r][i] = c < chunks ? __ldcs(rows[r] + c) : make_uint4(0, 0, 0, 0);
      }
  };
  load_tile(0);  // constant data: before the wait, and the rest of the rows into L2
  if (lane < kRows && n0 + lane < p.n && int64_t{kTile} * 32 < chunks)
    ptx::prefetch_l2_bulk(p.w + (n0 + lane) * p.k + int64_t{kTile} * 32 * 16,
                          static_cast<uint32_t>((chunks - int64_t{kTile} * 32) * 16));
  ptx::dependency_wait(trigger_first);

  // x's rows: each row's amax, then its codes' values.
  const auto* x = static_cast<const __nv_bfloat16*>(p.x);
#pragma unroll
  for (int t = 0; t < kTokens; ++t) {
    float amax = 0.0f;
    for (int64_t k = threadIdx.x * 8; k < p.k; k += kThreads * 8) {
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
  __syncthreads();
  if (threadIdx.x < kTokens) {
    const int t = static_cast<int>(threadIdx.x);
    float amax = 0.0f;
    for (int i = 0; i < kWarps; ++i) amax = fmaxf(amax, partial[i][t]);
    scale[t] = p.amax_in != nullptr     ? fmaxf(p.amax_in[t], 1e-12f) / 448.0f
               : p.static_scale > 0.0f ? p.static_scale
                                       : fmaxf(amax, 1e-12f) / 448.0f;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTokens; ++t)
    for (int64_t k = threadIdx.x; k < p.k; k += kThreads) {
      float& v = xq[t * kp + xq_index(k)];
      const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v / scale[t], __NV_SATFINITE, __NV_E4M3);
      v = __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
    }
  __syncthreads();

  float acc[kRows][kTokens] = {};
  for (int64_t base = 0; base < chunks; base += kTile * 32) {
    if (base > 0) load_tile(base);
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const int64_t c = base + i * 32 + lane;
      if (c >= chunks) continue;  // zero weights there; the shared memory past K is not written
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
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      float sum = acc[r][t];
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

template <int kTokens, int kRows>
void launch_rows(const Fp8GemvArgs& p, cudaStream_t stream) {
  const auto smem = static_cast<int>(kTokens * padded_k(p.k) * sizeof(float));
  auto* kernel = fp8_gemv_kernel<kTokens, kRows>;
  // The limit is set once per kernel and device (kernel_attributes.h): the largest any K needs.
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(kMaxSmemBytes));
  const int64_t rows_per_block = int64_t{kWarps} * kRows, blocks = (p.n + rows_per_block - 1) / rows_per_block;
  launch_kernel(kernel, static_cast<unsigned>(blocks), kThreads, smem, stream, p, trigger_first(kTriggerGemv));
  cuda_check(cudaGetLastError());
}

template <int kTokens>
void launch(const Fp8GemvArgs& p, cudaStream_t stream) {
  static const int setting = [] {
    const std::string rows = env_choice("NIBBLE_GEMV_ROWS", {"2", "4"});
    return rows.empty() ? kDefaultRows : std::stoi(rows);
  }();
  const int rows = p.rows_per_warp > 0 ? p.rows_per_warp : setting;
  check(rows == 2 || rows == 4, "fp8_gemv: ", rows, " rows a warp (2 or 4)");
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
