// TMA tensor maps through the driver's cuTensorMapEncodeTiled, found at run time (the runtime's entry
// point lookup), so that nothing links the driver library: CI builds and runs the CPU tests without one.
#include "cuda/tensor_map.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include "cuda/cuda_check.h"

namespace nibble::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    cuda_check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    check(found == cudaDriverEntryPointSuccess && f != nullptr, "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap byte_matrix_map_sw128(const void* base, int64_t rows, int64_t cols, int box_rows) {
  check(reinterpret_cast<uintptr_t>(base) % 16 == 0 && cols % 16 == 0 && rows >= 1 && box_rows >= 1 &&
            box_rows <= 256,
        "byte_matrix_map_sw128: bad matrix (", rows, " x ", cols, ", box rows ", box_rows, ")");
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};  // bytes between rows
  const cuuint32_t box[2] = {128, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
                                    element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for a ", rows, " x ",
        cols, " byte matrix");
  return map;
}

}  // namespace nibble::cuda
