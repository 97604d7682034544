// Uniform random routing for the benchmark: every token picks top_k distinct experts uniformly at
// random (seeded) with random positive weights summing to one. It stands in for the router so that
// all variants see the same assignment; it is not a router (no logits, no softmax).
#pragma once

#include <cstdint>
#include <vector>

#include "device_buffer.h"

namespace nibble::bench {

struct MoeShape {
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I, per expert
  int64_t num_experts = 0;        // E
  int64_t top_k = 0;              // K
};

// A routed pair p = t·K + k is token t's k-th expert. Rows of the grouped activations are the pairs
// sorted by expert (ascending p within one expert): "sorted row" r holds pair sorted_pairs[r].
struct Routing {
  int64_t num_tokens = 0;
  int64_t top_k = 0;
  int64_t num_experts = 0;
  std::vector<int32_t> topk_ids;    // (T, K), distinct per token
  std::vector<float> topk_weights;  // (T, K), each row sums to 1
  std::vector<int32_t>
      expert_offsets;  // (E + 1): expert e owns sorted rows [offsets[e], offsets[e+1])
  std::vector<int32_t> sorted_pairs;  // (T·K): pair of each sorted row
  std::vector<int32_t> pair_rows;     // (T·K): sorted row of each pair (inverse of sorted_pairs)

  int64_t num_rows() const { return num_tokens * top_k; }
  int64_t rows_of(int64_t e) const { return expert_offsets[e + 1] - expert_offsets[e]; }
  int64_t active_experts() const;  // experts with at least one row
};

Routing uniform_routing(const MoeShape& shape, int64_t num_tokens, uint64_t seed);

// The routing arrays the layer kernels read, on the device.
struct DeviceRouting {
  explicit DeviceRouting(const Routing& routing);
  DeviceBuffer topk_weights;  // F32 (T, K)
  DeviceBuffer sorted_pairs;  // I32 (T·K)
  DeviceBuffer pair_rows;     // I32 (T·K)
};

}  // namespace nibble::bench
