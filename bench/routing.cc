// Uniform random routing: a partial Fisher-Yates draw of K distinct experts per token.
#include "routing.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "core/error.h"

namespace nibble::bench {

int64_t Routing::active_experts() const {
  int64_t active = 0;
  for (int64_t e = 0; e < num_experts; ++e) active += rows_of(e) > 0 ? 1 : 0;
  return active;
}

Routing uniform_routing(const MoeShape& shape, int64_t num_tokens, uint64_t seed) {
  const int64_t experts = shape.num_experts;
  const int64_t top_k = shape.top_k;
  check(top_k >= 1 && top_k <= experts, "routing: top_k ", top_k, " must be in [1, ", experts, "]");
  Routing r;
  r.num_tokens = num_tokens;
  r.top_k = top_k;
  r.num_experts = experts;
  r.topk_ids.resize(num_tokens * top_k);
  r.topk_weights.resize(num_tokens * top_k);

  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(num_tokens)));
  std::uniform_real_distribution<float> weight_dist(0.1f, 1.0f);
  std::vector<int32_t> pool(experts);
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, experts - 1);
      std::swap(pool[k], pool[pick(rng)]);
      r.topk_ids[t * top_k + k] = pool[k];
      r.topk_weights[t * top_k + k] = weight_dist(rng);
      sum += r.topk_weights[t * top_k + k];
    }
    for (int64_t k = 0; k < top_k; ++k) r.topk_weights[t * top_k + k] /= sum;
  }

  // Counting sort of the pairs by expert; pairs stay in ascending order within an expert.
  r.expert_offsets.assign(experts + 1, 0);
  for (const int32_t e : r.topk_ids) ++r.expert_offsets[e + 1];
  std::partial_sum(r.expert_offsets.begin(), r.expert_offsets.end(), r.expert_offsets.begin());
  std::vector<int32_t> next(r.expert_offsets.begin(), r.expert_offsets.end() - 1);
  r.sorted_pairs.resize(r.num_rows());
  r.pair_rows.resize(r.num_rows());
  for (int64_t p = 0; p < r.num_rows(); ++p) {
    const int32_t row = next[r.topk_ids[p]]++;
    r.sorted_pairs[row] = static_cast<int32_t>(p);
    r.pair_rows[p] = row;
  }
  return r;
}

DeviceRouting::DeviceRouting(const Routing& routing)
    : topk_weights(upload_vector(routing.topk_weights)),
      sorted_pairs(upload_vector(routing.sorted_pairs)),
      pair_rows(upload_vector(routing.pair_rows)) {}

}  // namespace nibble::bench
