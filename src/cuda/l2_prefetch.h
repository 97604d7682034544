// Asking L2 for bytes ahead of their use: a weight read by a later kernel starts streaming while the
// kernels before it run (Ops::prefetch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace nibble::cuda {

// Bulk L2 prefetches of [p, p + bytes) (p 16-byte aligned; a tail under 16 bytes is left out) from a
// small kernel on `stream`. Under programmatic dependent launch the kernel still waits on the one
// before it, so that the kernel after it, which waits on it, finds every kernel before complete.
void prefetch_l2(const void* p, int64_t bytes, cudaStream_t stream);

}  // namespace nibble::cuda
