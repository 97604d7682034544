// A tensor-parallel communicator that can sum a layer's partial outputs over the ranks and add the sum
// into the residual stream with the RMSNorm after it, in one kernel: CudaOps::all_reduce_add_rms_norm
// asks for it; NcclCommunicator offers it peer to peer (p2p_all_reduce.h).
#pragma once

#include "core/tensor.h"

namespace nibble::cuda {

class ResidualNormAllReduce {
 public:
  virtual ~ResidualNormAllReduce() = default;
  // residual (F32 (T, H)) += the sum over the ranks of y (F32 (T, H)), normalized first with
  // post_weight when given, then out (BF16 (T, H)) = rms_norm(residual) · weight: the values of
  // Ops::all_reduce_add_rms_norm's steps, bit for bit. Afterwards y holds either this rank's values or
  // the sum. False, with nothing done, where this communicator cannot take these tensors (the same
  // answer on every rank for the same shapes).
  virtual bool all_reduce_add_rms_norm(Tensor& y, Tensor& residual, const Tensor* post_weight, const Tensor& weight,
                                       float eps, Tensor& out) = 0;
};

}  // namespace nibble::cuda
