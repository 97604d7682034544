// One CUDA error check carrying the caller's source location, raising nibble::Error.
#pragma once

#include <cuda_runtime_api.h>

#include <source_location>

#include "core/error.h"

namespace nibble {

inline void cuda_check(cudaError_t status, std::source_location where = std::source_location::current()) {
  if (status != cudaSuccess)
    fail("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") at ", where.file_name(),
         ":", where.line());
}

}  // namespace nibble
