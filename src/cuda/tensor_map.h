// TMA tensor maps (cp.async.bulk.tensor): the descriptor of a 2-D row-major byte matrix that the
// tensor-memory accelerator copies boxes of into shared memory, 128-byte swizzled (the layout wgmma's
// K-major operands take with SWIZZLE_128B descriptors).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace nibble::cuda {

// A (rows, cols) row-major matrix of bytes at `base` (16-byte aligned, cols a multiple of 16), copied
// in boxes of box_rows × 128 bytes, each 8-row group's 16-byte chunks swizzled as SWIZZLE_128B puts
// them (chunk c of row r at c ^ (r % 8)); out-of-range elements read as zero.
CUtensorMap byte_matrix_map_sw128(const void* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace nibble::cuda
