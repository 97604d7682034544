// FP8 × FP8 linear for few tokens on mma.sync (fp8_linear_mma.h). Each warp takes a 16-channel tile
// and one K split for every token (tiles of 8 tokens), streaming 64-K chunks straight from global
// memory into registers, two chunks in flight: lane (g, q) loads 16 bytes of channel rows g and g + 8
// and of token rows g + 8·t at K 16q .. 16q + 15 of the chunk. K step s of the chunk is then the
// 4-byte word s of every lane, read as int4_f16.cuh reads an activation word (bytes 0, 2 as logical
// K 2q, 2q + 1; bytes 1, 3 as 2q + 8, 2q + 9) for both operands, so that A and B agree on which K is
// which; the sum over a chunk covers each of its 64 K once.
#include "cuda/fp8_linear_mma.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/int4_f16_mma.cuh"
#include "cuda/launch.h"
#include "cuda/ptx.cuh"

namespace nibble::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int64_t kChunk = 64;        // K a chunk
constexpr int64_t kMinSplitK = 256;   // K a split at least
constexpr int kWarpsPerSm = 16;       // the warps a split count aims at, per SM

template <int kTiles>
struct Chunk {
  uint4 w[2];       // channel rows g, g + 8
  uint4 x[kTiles];  // token rows g + 8·t
};

template <int kTiles>
__global__ void __launch_bounds__(kWarps * 32) fp8_linear_mma_kernel(const __grid_constant__ Fp8MmaArgs p) {
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane >> 2, q = lane & 3;
  const int64_t tile = int64_t{blockIdx.x} * kWarps + warp;
  if (tile * 16 >= p.n) return;
  const int64_t k_begin = int64_t{blockIdx.y} * p.k_per_split, k_end = min(p.k, k_begin + p.k_per_split);
  const uint8_t* w_rows[2] = {p.w + (tile * 16 + g) * p.k, p.w + (tile * 16 + g + 8) * p.k};
  const uint8_t* x_rows[kTiles];
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int64_t row = t * 8 + g;
    x_rows[t] = row < p.tokens ? p.x + row * p.k : nullptr;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load = [&](int64_t k0, Chunk<kTiles>& c) {
    const int64_t at = k0 + 16 * q;
    const bool in = at < k_end;
#pragma unroll
    for (int r = 0; r < 2; ++r) c.w[r] = in ? *reinterpret_cast<const uint4*>(w_rows[r] + at) : zero;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
      c.x[t] = in && x_rows[t] != nullptr ? *reinterpret_cast<const uint4*>(x_rows[t] + at) : zero;
  };
  float acc[kTiles][4] = {};
  auto math = [&](const Chunk<kTiles>& c) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      auto word = [s](const uint4& v) { return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w; };
      uint32_t lo[2], hi[2];
      int4_f16::activation_fragment(word(c.w[0]), lo);
      int4_f16::activation_fragment(word(c.w[1]), hi);
      const uint32_t a[4] = {lo[0], hi[0], lo[1], hi[1]};  // rows g and g + 8, logical K 2q.. and 2q + 8..
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        uint32_t b[2];
        int4_f16::activation_fragment(word(c.x[t]), b);
        int4_f16::mma(acc[t], a, b);
      }
    }
  };
  // Two chunks in flight; a chunk past the split's end is zeros (exact, adds nothing).
  Chunk<kTiles> even, odd;
  load(k_begin, even);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += 2 * kChunk) {
    load(k0 + kChunk, odd);
    math(even);
    load(k0 + 2 * kChunk, even);
    math(odd);
  }
  // Accumulator j: channel g (j < 2) or g + 8, token 8t + 2q + j % 2.
  float* out = p.partial + int64_t{blockIdx.y} * p.tokens * p.n;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t token = t * 8 + 2 * q + (j & 1), channel = tile * 16 + g + ((j & 2) ? 8 : 0);
      if (token < p.tokens) out[token * p.n + channel] = acc[t][j];
    }
}

template <int kTiles>
void launch(const Fp8MmaArgs& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.n / 16 + kWarps - 1) / kWarps), static_cast<unsigned>(p.splits));
  launch_kernel(fp8_linear_mma_kernel<kTiles>, grid, kWarps * 32, 0, stream, p);
}

}  // namespace

bool fp8_mma_supported(int64_t tokens, int64_t n, int64_t k) {
  return tokens >= 1 && tokens <= kFp8MmaMaxTokens && n > 0 && n % 16 == 0 && k > 0 && k % 16 == 0;
}

int fp8_mma_splits(int64_t n, int64_t k, int num_sms, int64_t* k_per_split) {
  const int64_t tiles = n / 16, target = int64_t{num_sms} * kWarpsPerSm;
  const int64_t most = std::max<int64_t>(1, k / kMinSplitK);
  const int64_t wanted = std::clamp<int64_t>((target + tiles - 1) / tiles, 1, most);
  const int64_t per = ((k + wanted - 1) / wanted + kChunk - 1) / kChunk * kChunk;
  *k_per_split = per;
  return static_cast<int>((k + per - 1) / per);  // none empty
}

void fp8_linear_mma(const Fp8MmaArgs& p, cudaStream_t stream) {
  check(fp8_mma_supported(p.tokens, p.n, p.k), "fp8_linear_mma: ", p.tokens, " tokens, ", p.n, " × ", p.k,
        " (at most ", kFp8MmaMaxTokens, " tokens; N and K multiples of 16)");
  check(p.splits >= 1 && p.k_per_split % kChunk == 0 && (p.splits - 1) * p.k_per_split < p.k &&
            p.splits * p.k_per_split >= p.k,
        "fp8_linear_mma: ", p.splits, " splits of ", p.k_per_split, " do not cover K ", p.k);
  check(reinterpret_cast<std::uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<std::uintptr_t>(p.w) % 16 == 0,
        "fp8_linear_mma: the operands are not 16-byte aligned");
  if (p.tokens <= 8)
    launch<1>(p, stream);
  else if (p.tokens <= 16)
    launch<2>(p, stream);
  else if (p.tokens <= 32)
    launch<4>(p, stream);
  else
    launch<8>(p, stream);
  cuda_check(cudaGetLastError());
}

}  // namespace nibble::cuda
