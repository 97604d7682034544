# Compiles a wgmma source as the build does, with ptxas's advisories on, and fails where ptxas
# serializes the wgmma instructions of any kernel (C7510, C7520, ...: "wgmma.mma_async instructions are
# serialized"): each then waits for the one before, which costs the tensor cores their pipelining
# without any test of the results noticing. Run by ctest (no GPU needed):
#   cmake -DNVCC=... -DSOURCE=... -DINCLUDE=... -DARCH=... [-DDEFINES=a;b] -P check_wgmma_async.cmake
foreach(v NVCC SOURCE INCLUDE ARCH)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_wgmma_async: -D${v}= is missing")
  endif()
endforeach()
set(defines "")
foreach(d IN LISTS DEFINES)
  list(APPEND defines "-D${d}")
endforeach()
string(RANDOM LENGTH 8 tag)
set(object "${CMAKE_CURRENT_BINARY_DIR}/wgmma_check_${tag}.o")
execute_process(
  COMMAND "${NVCC}" -I${INCLUDE} -O3 -DNDEBUG ${defines} "--generate-code=arch=compute_${ARCH},code=[sm_${ARCH}]"
          -std=c++20 -Xptxas -v -x cu -c "${SOURCE}" -o "${object}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE "${object}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_wgmma_async: nvcc failed (${rc}) on ${SOURCE}:\n${err}")
endif()
string(REGEX MATCHALL "[^\n]*instructions are serialized[^\n]*" serialized "${out}\n${err}")
list(LENGTH serialized count)
if(count GREATER 0)
  string(REPLACE ";" "\n" lines "${serialized}")
  message(FATAL_ERROR "check_wgmma_async: ptxas serializes the wgmmas of ${count} kernel(s) in ${SOURCE}:\n${lines}")
endif()
string(REGEX MATCHALL "Compiling entry function" entries "${out}\n${err}")
list(LENGTH entries kernels)
if(kernels EQUAL 0)
  message(FATAL_ERROR "check_wgmma_async: ptxas compiled no kernel in ${SOURCE} (its report changed?)")
endif()
message(STATUS "check_wgmma_async: ${kernels} kernels of ${SOURCE}, every wgmma chain asynchronous")
