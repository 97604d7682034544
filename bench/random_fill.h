// Seeded random device data for the benchmark (weights and activations are never zeros): a counter
// hash per element, so any size fills in one launch and the same seed gives the same data.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace nibble::bench {

// out[i] = bf16(U(-amplitude, amplitude)), n elements.
void fill_uniform_bf16(void* out, std::size_t n, float amplitude, uint64_t seed,
                       cudaStream_t stream);
// out[i] = fp8_e4m3(U(-amplitude, amplitude)), saturating to ±448.
void fill_uniform_fp8(void* out, std::size_t n, float amplitude, uint64_t seed,
                      cudaStream_t stream);
// out[i] = U(lo, hi) in fp32.
void fill_uniform_f32(float* out, std::size_t n, float lo, float hi, uint64_t seed,
                      cudaStream_t stream);

}  // namespace nibble::bench
