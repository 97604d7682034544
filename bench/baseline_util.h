// Pieces both baselines share: the active experts' row ranges, and reading device weights back.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_kernels.h"
#include "routing.h"

namespace nibble::bench {

struct ExpertRows {
  int64_t expert = 0;
  int64_t first_row = 0;  // in sorted-row order
  int64_t num_rows = 0;   // > 0
};

std::vector<ExpertRows> active_expert_rows(const Routing& routing);

// n elements at `device` as fp32 × scale on the host (through a temporary device buffer).
std::vector<float> download_as_f32(const void* device, ElementType type, int64_t n, float scale);

// Uniform amplitude giving unit variance per output for a dot product of `fan_in` terms of
// unit-range inputs: sqrt(3 / fan_in).
float weight_amplitude(int64_t fan_in);

}  // namespace nibble::bench
