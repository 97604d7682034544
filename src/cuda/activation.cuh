// The expert activations on the device (the CPU twin's `activate` in cpu/moe.cc).
#pragma once

#include "model/ops.h"

namespace nibble::cuda {

__device__ inline float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: return x / (1.0f + expf(-x));
    case Activation::kGelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case Activation::kGeluTanh: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

}  // namespace nibble::cuda
