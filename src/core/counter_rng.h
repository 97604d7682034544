// A counter-based random source that the host and the GPU compute alike: the same (key, index) gives
// the same bits on both, so a sampled token does not depend on where the sampling ran. splitmix64
// (Steele, Lea and Flood) as the mixing function; Gumbel draws for the Gumbel-max sampling trick.
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define NIBBLE_HOST_DEVICE __host__ __device__
#else
#define NIBBLE_HOST_DEVICE
#endif

namespace nibble {

NIBBLE_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A Gumbel(0, 1) draw for element `index` under `key`: −log(−log u) with u uniform in (0, 1), in
// double (53 random bits, never 0 or 1).
NIBBLE_HOST_DEVICE inline double gumbel(uint64_t key, int64_t index) {
  const uint64_t bits = splitmix64(key ^ splitmix64(static_cast<uint64_t>(index)));
  const double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
  return -log(-log(u));
}

// The score whose argmax over a row samples softmax(logits / temperature) (Gumbel-max): each
// element's logit / temperature plus its Gumbel draw, in double.
NIBBLE_HOST_DEVICE inline double gumbel_score(float logit, float temperature, uint64_t key, int64_t index) {
  return static_cast<double>(logit) / static_cast<double>(temperature) + gumbel(key, index);
}

// On the host: a draw from softmax(logits / temperature) over a row of n, the argmax of gumbel_score,
// ties to the lowest index (a row of NaN and −inf only gives 0). Temperature > 0.
inline int32_t gumbel_argmax(const float* logits, int64_t n, float temperature, uint64_t key) {
  int32_t best = 0;
  double best_score = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const double score = gumbel_score(logits[i], temperature, key, i);
    if (score > best_score) best_score = score, best = static_cast<int32_t>(i);
  }
  return best;
}

}  // namespace nibble
