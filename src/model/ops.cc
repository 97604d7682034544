// Default implementations of the Ops interface.
#include "model/ops.h"

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

}  // namespace nibble
