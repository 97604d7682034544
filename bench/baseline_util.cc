// Shared helpers of the cuBLAS baselines.
#include "baseline_util.h"

#include <cmath>

#include "device_buffer.h"

namespace nibble::bench {

std::vector<ExpertRows> active_expert_rows(const Routing& routing) {
  std::vector<ExpertRows> rows;
  for (int64_t e = 0; e < routing.num_experts; ++e)
    if (routing.rows_of(e) > 0)
      rows.push_back(
          {.expert = e, .first_row = routing.expert_offsets[e], .num_rows = routing.rows_of(e)});
  return rows;
}

std::vector<float> download_as_f32(const void* device, ElementType type, int64_t n, float scale) {
  DeviceBuffer f32(static_cast<std::size_t>(n) * sizeof(float));
  convert_to_f32(device, type, n, scale, f32.as<float>(), nullptr);
  std::vector<float> host(n);
  cuda_check(cudaMemcpy(host.data(), f32.get(), f32.bytes(), cudaMemcpyDeviceToHost));
  return host;
}

float weight_amplitude(int64_t fan_in) {
  return std::sqrt(3.0f / static_cast<float>(fan_in));
}

}  // namespace nibble::bench
