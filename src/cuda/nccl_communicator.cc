// NcclCommunicator: init with NVLS off, the in-place sum, and abort for a failed rank.
#include "cuda/nccl_communicator.h"

#include <cstdlib>

#include "cuda/cuda_check.h"

namespace nibble::cuda {
namespace {

void nccl_check(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) fail("NCCL ", what, " failed: ", ncclGetErrorString(status));
}

}  // namespace

ncclUniqueId NcclCommunicator::make_id() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int rank, int size, cudaStream_t stream)
    : rank_(rank), size_(size), stream_(stream) {
  check(size >= 1 && rank >= 0 && rank < size, "NCCL: rank ", rank, " outside [0, ", size, ")");
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast
  nccl_check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

void NcclCommunicator::all_reduce_sum(Tensor& x) {
  check(x.device() == Device::kCuda && (x.dtype() == DType::kBF16 || x.dtype() == DType::kF32),
        "NCCL all_reduce_sum: ", x.describe(), " is not a BF16 or F32 device tensor");
  if (size_ == 1) return;
  const ncclDataType_t type = x.dtype() == DType::kBF16 ? ncclBfloat16 : ncclFloat32;
  nccl_check(ncclAllReduce(x.raw(), x.raw(), static_cast<std::size_t>(x.numel()), type, ncclSum, comm_,
                           stream_),
             "ncclAllReduce");
}

void NcclCommunicator::abort() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
}

}  // namespace nibble::cuda
