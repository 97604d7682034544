// Copy bandwidth (src/cuda/copy_bandwidth, shared with `nibble bench-one-batch`) and FP8 GEMM rate,
// measured the way the layer figures are (events, warm-up, median).
#include "ceilings.h"

#include "cuda/copy_bandwidth.h"
#include "device_buffer.h"
#include "handles.h"
#include "cuda/lt_fp8_gemm.h"
#include "random_fill.h"
#include "timing.h"

namespace nibble::bench {
namespace {

constexpr int kWarmup = 3;
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;

double fp8_gemm_rate(int64_t size, int reps, cudaStream_t stream) {
  const auto elements = static_cast<std::size_t>(size * size);
  DeviceBuffer a(elements);
  DeviceBuffer b(elements);
  DeviceBuffer d(elements * 2);
  DeviceBuffer workspace(kLtWorkspaceBytes);
  fill_uniform_fp8(a.get(), elements, 448.0f, 12, stream);
  fill_uniform_fp8(b.get(), elements, 448.0f, 13, stream);

  const LtHandle handle;
  cuda::LtFp8Gemm gemm(handle.get(), size, size, size, kLtWorkspaceBytes);
  const auto body = [&] { gemm.run(a.get(), b.get(), d.get(), 1.0f, workspace.get(), stream); };
  for (int i = 0; i < kWarmup; ++i) body();
  const double us = median(time_each(body, stream, reps));
  const auto n = static_cast<double>(size);
  return 2.0 * n * n * n / (us * 1e-6) / 1e12;
}

}  // namespace

Ceilings measure_ceilings(int64_t copy_bytes, int64_t gemm_size, int reps) {
  const Stream stream;
  return Ceilings{.copy_gb_per_s = cuda::measure_copy_bandwidth(copy_bytes, reps, stream.get()).gb_per_s,
                  .fp8_tflop_per_s = fp8_gemm_rate(gemm_size, reps, stream.get()),
                  .copy_bytes = copy_bytes,
                  .gemm_size = gemm_size};
}

}  // namespace nibble::bench
