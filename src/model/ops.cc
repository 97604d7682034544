// Default implementations of the Ops interface.
#include "model/ops.h"

#include <algorithm>
#include <cstring>

namespace nibble {

MoeWeights Ops::prepare_moe(const MoeWeights& host) {
  auto up = [this](const Tensor& t) { return t.defined() ? upload(t) : Tensor(); };
  MoeWeights w = host;
  w.router = up(host.router);
  w.experts.gate_up = up(host.experts.gate_up);
  w.experts.gate_up_scale = up(host.experts.gate_up_scale);
  w.experts.down = up(host.experts.down);
  w.experts.down_scale = up(host.experts.down_scale);
  return w;
}

void Ops::copy_to_device(const Tensor& host, Tensor& dst) {
  // The host-memory default (CPU backend): a plain copy.
  check(host.device() == Device::kCpu && dst.device() == Device::kCpu && host.dtype() == dst.dtype() &&
            host.numel() == dst.numel(),
        "copy_to_device: ", host.describe(), " does not fit ", dst.describe());
  std::memcpy(dst.raw(), host.raw(), static_cast<std::size_t>(host.nbytes()));
}

void Ops::argmax(const Tensor& x, Tensor& out) {
  check(x.device() == Device::kCpu && out.device() == Device::kCpu, "argmax: host tensors expected");
  expect(x, DType::kF32, {-1, -1}, "argmax input");
  expect(out, DType::kI32, {x.dim(0)}, "argmax output");
  const int64_t V = x.dim(1);
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const float* row = x.data<float>() + r * V;
    out.data<int32_t>()[r] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
}

void Ops::add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  add(x, y);
  rms_norm(x, weight, eps, out);
}

std::unique_ptr<RecordedStep> Ops::record(const std::function<void()>& /*step*/) { return nullptr; }

}  // namespace nibble
