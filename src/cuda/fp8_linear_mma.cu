// FP8 × FP8 linear for few tokens on mma.sync (fp8_linear_mma.h). A block of kWarps warps takes
// 16·kChannelTiles channels for every token (tiles of 8 tokens), about one block an SM for the whole
// of N (launch_for), so each block streams a long run of weights; its warps split K in 64-K chunks
// dealt round robin (warp w: chunks w, w + kWarps, ...), streaming them straight from global memory
// into registers, two chunks in flight: lane (g, q) loads 16 bytes of channel rows g and g + 8 of each
// tile and of token rows g + 8·t at K 16q .. 16q + 15 of the chunk. K step s of the chunk is then the
// 4-byte word s of every lane, read as int4_f16.cuh reads an activation word (bytes 0, 2 as logical
// K 2q, 2q + 1; bytes 1, 3 as 2q + 8, 2q + 9) for both operands, so that A and B agree on which K is
// which; the sum over a chunk covers each of its 64 K once. The warps' sums meet in shared memory,
// added in warp order, then scaled as the scaling pass of linear.cu scales (sum · x_scale · w_scale).
#include "cuda/fp8_linear_mma.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/int4_f16_mma.cuh"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int64_t kChunk = 64;  // K a chunk

template <int kChannelTiles, int kTokenTiles>
struct Chunk {
  uint4 w[kChannelTiles][2];  // channel rows g, g + 8 of each tile
  uint4 x[kTokenTiles];       // token rows g + 8·t
};

template <int kChannelTiles, int kTokenTiles>
__global__ void __launch_bounds__(kWarps * 32) fp8_linear_mma_kernel(const __grid_constant__ Fp8MmaArgs p) {
  // Each warp's sums of one channel tile, in the accumulators' layout (token tile, lane, register).
  __shared__ float4 sums[kWarps][kTokenTiles][32];
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane >> 2, q = lane & 3;
  const int64_t channel0 = int64_t{blockIdx.x} * 16 * kChannelTiles, chunks = (p.k + kChunk - 1) / kChunk;
  const uint8_t* w_rows[kChannelTiles][2];
#pragma unroll
  for (int c = 0; c < kChannelTiles; ++c) {
    const int64_t row = min(channel0 + 16 * c + g, p.n - 16 + g);  // a tile past N reads the last one
    w_rows[c][0] = p.w + row * p.k;
    w_rows[c][1] = p.w + (row + 8) * p.k;
  }
  const uint8_t* x_rows[kTokenTiles];
#pragma unroll
  for (int t = 0; t < kTokenTiles; ++t) {
    const int64_t row = t * 8 + g;
    x_rows[t] = row < p.tokens ? p.x + row * p.k : nullptr;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load = [&](int64_t chunk, Chunk<kChannelTiles, kTokenTiles>& c) {
    const int64_t at = chunk * kChunk + 16 * q;
    const bool in = chunk < chunks && at < p.k;
#pragma unroll
    for (int t = 0; t < kChannelTiles; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) c.w[t][r] = in ? *reinterpret_cast<const uint4*>(w_rows[t][r] + at) : zero;
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t)
      c.x[t] = in && x_rows[t] != nullptr ? *reinterpret_cast<const uint4*>(x_rows[t] + at) : zero;
  };
  float acc[kChannelTiles][kTokenTiles][4] = {};
  auto math = [&](const Chunk<kChannelTiles, kTokenTiles>& c) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      auto word = [s](const uint4& v) { return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w; };
      uint32_t b[kTokenTiles][2];
#pragma unroll
      for (int t = 0; t < kTokenTiles; ++t) int4_f16::activation_fragment(word(c.x[t]), b[t]);
#pragma unroll
      for (int ct = 0; ct < kChannelTiles; ++ct) {
        uint32_t lo[2], hi[2];
        int4_f16::activation_fragment(word(c.w[ct][0]), lo);
        int4_f16::activation_fragment(word(c.w[ct][1]), hi);
        const uint32_t a[4] = {lo[0], hi[0], lo[1], hi[1]};  // rows g and g + 8, logical K 2q.. and 2q + 8..
#pragma unroll
        for (int t = 0; t < kTokenTiles; ++t) int4_f16::mma(acc[ct][t], a, b[t]);
      }
    }
  };
  // Two chunks in flight; a chunk past K is zeros (exact, adds nothing).
  Chunk<kChannelTiles, kTokenTiles> even, odd;
  load(warp, even);
  for (int64_t chunk = warp; chunk < chunks; chunk += 2 * kWarps) {
    load(chunk + kWarps, odd);
    math(even);
    load(chunk + 2 * kWarps, even);
    math(odd);
  }
  // Register j of lane (g, q) in channel tile ct, token tile t: channel 16ct + g (+ 8 for j ≥ 2),
  // token 8t + 2q + j % 2. One channel tile at a time through shared memory.
  constexpr int kOutputs = kTokenTiles * 32 * 4;
#pragma unroll
  for (int ct = 0; ct < kChannelTiles; ++ct) {
#pragma unroll
    for (int t = 0; t < kTokenTiles; ++t)
      sums[warp][t][lane] = make_float4(acc[ct][t][0], acc[ct][t][1], acc[ct][t][2], acc[ct][t][3]);
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < kOutputs; i += kWarps * 32) {
      const int j = i % 4, l = (i / 4) % 32, t = i / 128;
      const int64_t token = 8 * t + 2 * (l & 3) + (j & 1), channel = channel0 + 16 * ct + (l >> 2) + (j & 2) * 4;
      if (token >= p.tokens || channel >= p.n) continue;
      const auto* warp_sums = reinterpret_cast<const float*>(&sums[0][t][l]) + j;
      float sum = warp_sums[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sum += warp_sums[w * kTokenTiles * 32 * 4];
      const float y = sum * p.x_scale[token] * p.w_scale[channel];
      if (p.out_f32)
        static_cast<float*>(p.out)[token * p.n + channel] = y;
      else
        static_cast<__nv_bfloat16*>(p.out)[token * p.n + channel] = __float2bfloat16_rn(y);
    }
    __syncthreads();  // every sum read before the next tile's are written
  }
}

template <int kChannelTiles, int kTokenTiles>
void launch(const Fp8MmaArgs& p, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((p.n / 16 + kChannelTiles - 1) / kChannelTiles);
  launch_kernel(fp8_linear_mma_kernel<kChannelTiles, kTokenTiles>, blocks, kWarps * 32, 0, stream, p);
}

// Channel tiles a block for this many tiles: as few blocks as the SMs (one block an SM: about 150 to
// 240 registers a thread), up to 4 tiles a block; one with 8 token tiles (two would spill).
template <int kTokenTiles>
void launch_for(const Fp8MmaArgs& p, cudaStream_t stream) {
  const int64_t tiles = p.n / 16, sms = multiprocessor_count();
  const int64_t per_block = std::clamp<int64_t>((tiles + sms - 1) / sms, 1, 4);
  if constexpr (kTokenTiles == 8) {
    return launch<1, kTokenTiles>(p, stream);
  } else {
    if (per_block == 1) return launch<1, kTokenTiles>(p, stream);
    if (per_block == 2) return launch<2, kTokenTiles>(p, stream);
    if (per_block == 3) return launch<3, kTokenTiles>(p, stream);
    return launch<4, kTokenTiles>(p, stream);
  }
}

}  // namespace

bool fp8_mma_supported(int64_t tokens, int64_t n, int64_t k) {
  return tokens >= 1 && tokens <= kFp8MmaMaxTokens && n > 0 && n % 16 == 0 && k > 0 && k % 16 == 0;
}

void fp8_linear_mma(const Fp8MmaArgs& p, cudaStream_t stream) {
  check(fp8_mma_supported(p.tokens, p.n, p.k), "fp8_linear_mma: ", p.tokens, " tokens, ", p.n, " × ", p.k,
        " (at most ", kFp8MmaMaxTokens, " tokens; N and K multiples of 16)");
  check(reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.w) % 16 == 0,
        "fp8_linear_mma: the operands are not 16-byte aligned");
  if (p.tokens <= 8)
    launch_for<1>(p, stream);
  else if (p.tokens <= 16)
    launch_for<2>(p, stream);
  else if (p.tokens <= 32)
    launch_for<4>(p, stream);
  else
    launch_for<8>(p, stream);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
