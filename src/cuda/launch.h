// Kernel launches with programmatic dependent launch (PDL, sm_90): launched with the attribute, a
// kernel's blocks may be scheduled while the previous kernel in the stream finishes, so the launch
// gap hides behind its tail. Every kernel launched here must call ptx::grid_dependency_wait() before
// its first access to memory that earlier work writes (ptx.cuh), and ptx::launch_dependents() only
// after it. So when a kernel starts, every kernel two or more launches back in its stream has
// completed: what they wrote (the MoE routing, for the MoE GEMM's early weight copies) may be read
// before the wait; constant data (weights) always may. One exception: the MoE activation kernel
// (moe_quantize.cu) triggers before its wait, so that the down GEMM's blocks start their weight copies
// while gate_up's last blocks still run; the down GEMM reads before its wait only the weights and the
// routing, which is complete once any gate_up block has passed its own wait. NIBBLE_PDL=0 in the
// environment launches without the attribute (plain stream order). Not for cuBLAS(Lt) or NCCL work,
// which launches its own kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/env_setting.h"

namespace nibble::cuda {

enum class Pdl { kOff, kOn };

namespace detail {
inline thread_local int plain_depth = 0;  // PlainLaunches alive on this thread
inline std::atomic<Pdl>& pdl_setting() {
  static std::atomic<Pdl> setting{env_choice("NIBBLE_PDL", {"0", "1"}) == "0" ? Pdl::kOff : Pdl::kOn};
  return setting;
}
}  // namespace detail

// Whether launches carry the PDL attribute: on unless NIBBLE_PDL=0 or a PlainLaunches lives on this
// thread.
inline Pdl pdl() {
  return detail::plain_depth > 0 ? Pdl::kOff : detail::pdl_setting().load(std::memory_order_relaxed);
}

// While one that is `on` lives, this thread launches without the PDL attribute (plain stream order).
class PlainLaunches {
 public:
  explicit PlainLaunches(bool on) : on_(on) { detail::plain_depth += on_ ? 1 : 0; }
  ~PlainLaunches() { detail::plain_depth -= on_ ? 1 : 0; }
  PlainLaunches(const PlainLaunches&) = delete;
  PlainLaunches& operator=(const PlainLaunches&) = delete;

 private:
  bool on_;
};

// Whether NIBBLE_PDL_PLAIN (comma-separated: linear, attention, moe, allreduce, allreduce-sum,
// allreduce-max) names `site`: its kernels then launch without PDL. A bisecting tool for questions about PDL (read once).
inline bool plain_site(std::string_view site) {
  static const std::string list = [] {
    const char* v = std::getenv("NIBBLE_PDL_PLAIN");
    std::string names(",");
    names.append(v != nullptr ? v : "").push_back(',');
    return names;
  }();
  const std::string_view names(list);  // ",a,b,": a name sits between two commas
  for (std::size_t at = names.find(site); at != std::string_view::npos; at = names.find(site, at + 1))
    if (at > 0 && names[at - 1] == ',' && names[at + site.size()] == ',') return true;
  return false;
}

// Overrides NIBBLE_PDL for the launches that follow (tests run a chain both ways). A CUDA graph keeps
// what its launches had when it was captured.
inline void set_pdl(Pdl mode) { detail::pdl_setting().store(mode, std::memory_order_relaxed); }

// Kernels that let the next kernel launch before their own grid dependency wait (ptx::dependency_wait)
// rather than after it, so that the next kernel's blocks take the SMs and start what they may do before
// their wait (their weights' loads) while this kernel still waits for the one before. The next kernel
// then may start before the one two launches back has completed: each site's possible successors read
// nothing before their wait but constants, the host's step inputs and older steps' KV cache (the
// RMSNorm is followed by the FP8 linears, the per-token quantization, the routing or the all-reduce;
// the few-token FP8 linear by the decode attention, the KV append, the RMSNorm or the all-reduce; the
// decode attention by the o projection or its merge kernel; the MoE combine by the RMSNorm). The MoE
// GEMM's settled routing (read before its wait) stays two launches back: the routing's and the MoE
// quantization's kernels never trigger first. The MoE activation always does (moe_quantize.cu).
// NIBBLE_TRIGGER_FIRST lists sites (comma-separated: norm, gemv, attention, combine; or all); none by
// default.
enum TriggerSite : unsigned { kTriggerNorm = 1, kTriggerGemv = 2, kTriggerAttention = 4, kTriggerCombine = 8 };
// The mask of TriggerSite a NIBBLE_TRIGGER_FIRST value lists (empty: none); an unknown name is an error.
inline unsigned parse_trigger_sites(std::string_view list) {
  unsigned mask = 0;
  std::size_t begin = 0;
  while (begin < list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view name = list.substr(begin, end - begin);
    if (name == "all") mask |= kTriggerNorm | kTriggerGemv | kTriggerAttention | kTriggerCombine;
    else if (name == "norm") mask |= kTriggerNorm;
    else if (name == "gemv") mask |= kTriggerGemv;
    else if (name == "attention") mask |= kTriggerAttention;
    else if (name == "combine") mask |= kTriggerCombine;
    else if (!name.empty()) fail("NIBBLE_TRIGGER_FIRST lists norm, gemv, attention, combine or all, not ", name);
    begin = end + 1;
  }
  return mask;
}
namespace detail {
inline std::atomic<unsigned>& trigger_first_sites() {
  static std::atomic<unsigned> sites = [] {
    const char* v = std::getenv("NIBBLE_TRIGGER_FIRST");
    return parse_trigger_sites(v != nullptr ? v : "");
  }();
  return sites;
}
}  // namespace detail
// Whether `site`'s kernels launched from now on trigger first (with PDL on; a graph keeps what it captured).
inline bool trigger_first(TriggerSite site) {
  return pdl() == Pdl::kOn && (detail::trigger_first_sites().load(std::memory_order_relaxed) & site) != 0;
}
// Overrides NIBBLE_TRIGGER_FIRST for the launches that follow (a mask of TriggerSite; tests).
inline void set_trigger_first(unsigned sites) {
  detail::trigger_first_sites().store(sites, std::memory_order_relaxed);
}
inline unsigned trigger_first_sites() { return detail::trigger_first_sites().load(std::memory_order_relaxed); }

// A thread-block cluster of `x` blocks along the grid's x, for launch_kernel_with.
inline cudaLaunchAttribute cluster_shape(unsigned x) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim = {x, 1, 1};
  return attribute;
}

// kernel<<<grid, block, smem, stream>>>(args...) with the launch attributes `extra` (a cluster shape;
// 3 at most) and PDL's when enabled. Arguments convert to the kernel's parameter types.
template <typename... Params, typename... Args>
void launch_kernel_with(std::initializer_list<cudaLaunchAttribute> extra, void (*kernel)(Params...), dim3 grid,
                        dim3 block, std::size_t smem, cudaStream_t stream, Args&&... args) {
  std::array<cudaLaunchAttribute, 4> attributes{};
  check(extra.size() < attributes.size(), "launch_kernel_with: ", extra.size(), " extra attributes");
  unsigned count = 0;
  for (const cudaLaunchAttribute& a : extra) attributes[count++] = a;
  if (pdl() == Pdl::kOn) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = count > 0 ? attributes.data() : nullptr;
  config.numAttrs = count;
  cuda_check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL's attribute when enabled.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, cudaStream_t stream,
                   Args&&... args) {
  launch_kernel_with({}, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace nibble::cuda
