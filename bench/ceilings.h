// The two ceilings every figure is measured against, on this GPU, in this run (DESIGN.md §7):
// device-to-device copy bandwidth and the cuBLASLt FP8 e4m3 GEMM rate at 8192³.
#pragma once

#include <cstdint>

namespace nibble::bench {

struct Ceilings {
  double copy_gb_per_s = 0.0;    // (bytes read + bytes written) / time, median
  double fp8_tflop_per_s = 0.0;  // 2·n³ / time, median
  int64_t copy_bytes = 0;        // size of one copy
  int64_t gemm_size = 0;         // n of the n×n×n GEMM
};

// cudaMemcpyAsync of `copy_bytes` (≥ 2 GiB by default) and an FP8 TN GEMM of n = gemm_size with
// fp32 accumulation and BF16 output, on random data; each the median of `reps` timed runs after
// warm-up.
Ceilings measure_ceilings(int64_t copy_bytes = int64_t{2} << 30, int64_t gemm_size = 8192,
                          int reps = 20);

}  // namespace nibble::bench
