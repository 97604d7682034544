// The expert activations on the device (the CPU twin's `activate` in cpu/moe.cc).
#pragma once

#include <type_traits>

#include "model/ops.h"

namespace nibble::cuda {

template <Activation kAct>
__device__ inline float activate(float x) {
  if constexpr (kAct == Activation::kSilu) return x / (1.0f + expf(-x));
  if constexpr (kAct == Activation::kGelu) return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
  if constexpr (kAct == Activation::kGeluTanh)
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

__device__ inline float activate(Activation act, float x) {
  switch (act) {
    case Activation::kSilu: return activate<Activation::kSilu>(x);
    case Activation::kGelu: return activate<Activation::kGelu>(x);
    case Activation::kGeluTanh: return activate<Activation::kGeluTanh>(x);
  }
  return x;
}

// f(std::integral_constant<Activation, act>{}): a loop over many values branches on `act` once.
template <typename F>
__device__ inline void with_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::kSilu: f(std::integral_constant<Activation, Activation::kSilu>{}); break;
    case Activation::kGelu: f(std::integral_constant<Activation, Activation::kGelu>{}); break;
    case Activation::kGeluTanh: f(std::integral_constant<Activation, Activation::kGeluTanh>{}); break;
  }
}

}  // namespace nibble::cuda
