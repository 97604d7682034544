// The interface every timed MoE layer implements (nibble's W4A8 layer and the cuBLAS/cuBLASLt
// baselines), and the inputs they share so that all of them run on the same data.
// Not a MoE API for the engine: a benchmark seam only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "routing.h"

namespace nibble::bench {

// Enqueues the whole layer (route -> gate_up -> activation -> down -> combine) on a stream: no
// allocation, no host synchronization, so that it can be captured in a CUDA graph.
using LayerLaunch = std::function<void(cudaStream_t)>;

// What every variant reads for one token count. Device pointers; the routing is uniform random
// (routing.h), decided on the host so that every variant sees the same expert assignment.
struct LayerInputs {
  int64_t num_tokens = 0;            // T
  const void* x = nullptr;           // BF16 (T, H), row-major
  const Routing* routing = nullptr;  // host copy: counts per expert, for GEMM sizes
  const DeviceRouting* device_routing = nullptr;
};

// One expert's weights as fp32 values (already multiplied by their scales), for the CPU reference.
struct HostExpert {
  std::vector<float> gate_up;  // (2I, H), row-major: rows [0, I) gate, [I, 2I) up
  std::vector<float> down;     // (H, I), row-major
};

class MoeVariant {
 public:
  virtual ~MoeVariant() = default;

  virtual std::string name() const = 0;
  // Bytes of expert weights and their scales one layer call reads when `active_experts` experts
  // received at least one token.
  virtual double weight_bytes(int64_t active_experts) const = 0;
  // Host-side preparation for one token count (GEMM plans, pointer tables). The launch it returns
  // stays valid until the next prepare() and writes output().
  virtual LayerLaunch prepare(const LayerInputs& inputs) = 0;
  // BF16 (T, H) row-major on the device: the result of the last launch.
  virtual const void* output() const = 0;

  // For --check: expert `e`'s weights as the GPU sees them, or nothing when the variant's routing
  // is its own (nibble's router) and a reference from the shared routing would not apply.
  virtual std::optional<HostExpert> expert_weights(int64_t /*e*/) const { return std::nullopt; }
  // Largest accepted ‖out − ref‖ / ‖ref‖ against the fp64 reference from expert_weights().
  virtual double check_tolerance() const { return 1e-2; }
};

}  // namespace nibble::bench
