// Default implementations of the Ops interface.
#include "model/ops.h"

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

std::unique_ptr<RecordedStep> Ops::record(const std::function<void()>& /*step*/) { return nullptr; }

}  // namespace nibble
