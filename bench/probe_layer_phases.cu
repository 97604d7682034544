// How fast a batch-1 decode step could stream its weights: Mixtral-8x7B's layer as nine phases of
// bytes (the attention RMSNorm, q/k/v 25.2 MB, the KV cache 2 MB, o 16.8 MB, the MoE RMSNorm, the
// router 64 KB, gate_up 117.4 MB, down 58.7 MB, the combine), 32 layers, each phase read whole by
// every SM before the next starts, two ways:
//   kernels     one kernel a phase, the 288 launches recorded in a CUDA graph with programmatic
//               dependent launch (launch.h's rule: each waits for the one before, then lets the next
//               launch), as the engine's decode step runs its ~11 kernels a layer;
//   persistent  one kernel for the whole step, one block an SM (or two), the phases separated by a
//               grid-wide barrier (an arrival counter and a generation word in global memory), as a
//               fused decode layer ("megakernel") would run.
// Both also with the next copies started early: a kernel's first ring of copies before its grid
// dependency wait (as the engine's FP8 linears and MoE GEMMs do), the persistent kernel's next phase's
// first ring before the barrier. Every phase with 0 bytes times the bare chain (launches or
// barriers). A phase's bytes are split evenly over the blocks; a block's thread 0 streams its share
// into shared memory by bulk copies (evict-first, as the MoE GEMM's weights), a ring of four 16 KB
// slots: 64 KB a block in flight. The copy ceiling is a 1 GiB device-to-device copy (read + written
// bytes over its time). The step's figure against the engine's batch-1 step
// (bench/RESULTS.md: 3.33 ms on an H200, 3.89 on an H100) bounds what fusing the layer could gain.
// Not part of the build (a measurement tool):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/probe_layer_phases.cu -o /tmp/probe_layer
//   /tmp/probe_layer
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/ptx.cuh"

namespace {

namespace ptx = nibble::cuda::ptx;

constexpr int kLayers = 32, kPhases = 9, kThreads = 128;
// Mixtral-8x7B at batch 1, a layer (bytes): FP8 q/k/v and o, an FP8 KV cache of 1024 keys, a BF16
// router, two INT4 experts' gate_up and down.
constexpr int64_t kMixtralPhases[kPhases] = {0,       25165824, 2097152,   16777216, 0,
                                             65536,   117440512, 58720256, 0};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "probe_layer_phases: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A block's ring of bulk copies into shared memory: kSlots slots of kChunk bytes, each completing on
// its mbarrier; `issued` counts the copies so far (thread 0's, across phases).
constexpr int kSlots = 4, kChunk = 16 << 10, kSmemBytes = kSlots * kChunk;
struct Ring {
  uint8_t* buf;
  uint64_t* bar;
  int64_t issued;
};

__device__ inline Ring ring_start(uint8_t* smem, uint64_t* bars) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) ptx::mbarrier_init(&bars[s], 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  return Ring{smem, bars, 0};
}

__device__ inline int64_t chunks_in(int64_t begin, int64_t end) { return (end - begin + kChunk - 1) / kChunk; }

// Thread 0: chunks [from, to) of the share [begin, end) of `data` (chunk k at begin + k · kChunk) into
// the ring by bulk copies, as the MoE GEMM's producer streams weights (no consumer reads them: their
// arrival is the work), each slot reused once its last copy has landed.
__device__ inline void issue(const uint8_t* data, int64_t begin, int64_t end, int64_t from, int64_t to, Ring& r) {
  for (int64_t k = from; k < to; ++k, ++r.issued) {
    const int slot = static_cast<int>(r.issued % kSlots);
    if (r.issued >= kSlots) ptx::mbarrier_wait(&r.bar[slot], static_cast<uint32_t>((r.issued / kSlots - 1) & 1));
    const int64_t at = begin + k * kChunk;
    const auto n = static_cast<uint32_t>(end - at < kChunk ? end - at : kChunk);
    ptx::mbarrier_arrive_expect_tx(&r.bar[slot], n);
    ptx::bulk_copy_to_shared_evict_first(r.buf + slot * kChunk, data + at, n, &r.bar[slot]);
  }
}

// Thread 0: waits for the copies issued before copy number `upto` that no later copy has reused the
// slot of (those have landed already).
__device__ inline void drain(Ring& r, int64_t upto) {
  for (int64_t k = upto > kSlots ? upto - kSlots : 0; k < upto; ++k)
    if (k + kSlots >= r.issued) ptx::mbarrier_wait(&r.bar[k % kSlots], static_cast<uint32_t>((k / kSlots) & 1));
}

// Phase p's bytes in the weight buffer: each layer's phases one after another.
struct Phases {
  int64_t bytes[kPhases];
  int64_t offset[kPhases];  // within a layer
  int64_t layer_bytes;
};

Phases make_phases(const int64_t (&bytes)[kPhases]) {
  Phases p{};
  int64_t at = 0;
  for (int i = 0; i < kPhases; ++i) {
    p.bytes[i] = bytes[i];
    p.offset[i] = at;
    at += (bytes[i] + 4095) / 4096 * 4096;
  }
  p.layer_bytes = at;
  return p;
}

__device__ inline int64_t smaller(int64_t x, int64_t y) { return x < y ? x : y; }

// The block's share of a phase: whole 16-byte words, split evenly.
__device__ inline void share_of(int64_t bytes, int64_t& begin, int64_t& end) {
  const int64_t words = bytes / 16, per = (words + gridDim.x - 1) / gridDim.x;
  begin = smaller(words, per * blockIdx.x) * 16;
  end = smaller(words, per * (blockIdx.x + 1)) * 16;
}

// One phase of one layer as its own kernel (PDL: wait for the one before, then let the next launch);
// `early`: the ring's first copies issued before the wait (the weights are constant), as the engine's
// FP8 linears and MoE GEMMs do.
__global__ void __launch_bounds__(kThreads) phase_kernel(const uint8_t* layer, int64_t bytes, bool early) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kSlots];
  Ring ring = ring_start(smem, bars);
  int64_t begin, end;
  share_of(bytes, begin, end);
  const int64_t n = chunks_in(begin, end), first = early ? smaller(n, kSlots) : 0;
  if (threadIdx.x == 0) issue(layer, begin, end, 0, first, ring);
  ptx::grid_dependency_wait();
  ptx::launch_dependents();
  if (threadIdx.x != 0) return;
  issue(layer, begin, end, first, n, ring);
  drain(ring, ring.issued);
}

// The grid-wide barrier: thread 0 of each block adds itself to `count`; the last one resets it and
// bumps `generation`, which the others wait to see change.
__device__ inline void grid_barrier(unsigned* count, volatile unsigned* generation) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned gen = *generation;
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(generation), 1u);
    } else {
      while (*generation == gen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// The whole step in one kernel: layers × phases, a grid barrier after each phase, each phase's copies
// landed before it; `early`: the ring's first copies of the next phase issued before the barrier (the
// weights do not depend on it; in a fused layer only their use would wait).
__global__ void __launch_bounds__(kThreads) persistent_kernel(const uint8_t* weights, Phases ph, bool early,
                                                              unsigned* count, unsigned* generation) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kSlots];
  Ring ring = ring_start(smem, bars);
  int64_t ahead = 0;  // chunks of this phase issued before the last barrier
  for (int l = 0; l < kLayers; ++l)
    for (int p = 0; p < kPhases; ++p) {
      const uint8_t* layer = weights + l * ph.layer_bytes;
      if (threadIdx.x == 0) {
        int64_t begin, end;
        share_of(ph.bytes[p], begin, end);
        issue(layer + ph.offset[p], begin, end, ahead, chunks_in(begin, end), ring);
        const int64_t mine = ring.issued;  // this phase's copies end here
        ahead = 0;
        if (early && (l + 1 < kLayers || p + 1 < kPhases)) {
          const int next = p + 1 < kPhases ? p + 1 : 0;
          const uint8_t* next_layer = p + 1 < kPhases ? layer : layer + ph.layer_bytes;
          share_of(ph.bytes[next], begin, end);
          ahead = smaller(chunks_in(begin, end), kSlots);
          issue(next_layer + ph.offset[next], begin, end, 0, ahead, ring);
        }
        drain(ring, mine);
      }
      grid_barrier(count, generation);
    }
  if (threadIdx.x == 0) drain(ring, ring.issued);
}

__global__ void fill_kernel(uint4* data, int64_t words) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words; i += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    data[i] = make_uint4(h, h ^ 0x5bd1e995u, h + 1, h * 3);
  }
}

float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "event time");
  return ms;
}

}  // namespace

int main() {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  const Phases real = make_phases(kMixtralPhases);
  const int64_t zero[kPhases] = {};
  const Phases bare = make_phases(zero);
  const int64_t total = real.layer_bytes * kLayers;
  uint8_t* weights;
  check(cudaMalloc(&weights, total), "weights");
  fill_kernel<<<sms * 4, 256>>>(reinterpret_cast<uint4*>(weights), total / 16);
  unsigned* sync;
  check(cudaMalloc(&sync, 2 * sizeof(unsigned)), "barrier");
  check(cudaMemset(sync, 0, 2 * sizeof(unsigned)), "barrier");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  check(cudaFuncSetAttribute(phase_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), "smem");
  check(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes), "smem");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);

  // The copy ceiling: 1 GiB device to device, read + written bytes.
  const int64_t copy_bytes = int64_t{1} << 30;
  uint8_t *src, *dst;
  check(cudaMalloc(&src, copy_bytes), "copy source");
  check(cudaMalloc(&dst, copy_bytes), "copy target");
  cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream);
  std::vector<float> copies;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(a, stream);
    cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(b, stream);
    check(cudaEventSynchronize(b), "copy");
    copies.push_back(time_ms(a, b));
  }
  std::sort(copies.begin(), copies.end());
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copies[2] * 1e6);
  cudaFree(src);
  cudaFree(dst);
  std::printf("%s, %d SMs; copy %.0f GB/s; a step's weights %.2f GB (%.1f MB a layer): %.1f us at copy\n",
              prop.name, sms, copy_gbs, total / 1e9, real.layer_bytes / 1e6, total / copy_gbs / 1e3);

  auto median_of = [&](auto&& run) {
    run();  // warm-up
    std::vector<float> ms;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(a, stream);
      run();
      cudaEventRecord(b, stream);
      check(cudaEventSynchronize(b), "run");
      ms.push_back(time_ms(a, b));
    }
    std::sort(ms.begin(), ms.end());
    return ms[3];
  };
  auto report = [&](const char* what, const Phases& ph, float ms) {
    const double bytes = static_cast<double>(ph.layer_bytes) * kLayers;
    std::printf("%-44s %8.1f us a step  %6.2f us a layer", what, ms * 1e3, ms * 1e3 / kLayers);
    if (bytes > 0) std::printf("  %6.0f GB/s  %5.1f%% of copy", bytes / (ms * 1e6), 100.0 * bytes / (ms * 1e6) / copy_gbs);
    std::printf("\n");
  };

  // One kernel a phase, recorded in a graph with PDL.
  struct Chain {
    const Phases* ph;
    bool early;
    const char* what;
  };
  for (const Chain c : {Chain{&bare, false, "kernels, no bytes (288 launches, PDL)"},
                        Chain{&real, false, "kernels, one a phase (PDL)"},
                        Chain{&real, true, "kernels, first copies before the wait"}}) {
    const Phases* ph = c.ph;
    const bool early = c.early;
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
    for (int l = 0; l < kLayers; ++l)
      for (int p = 0; p < kPhases; ++p) {
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(static_cast<unsigned>(sms * 2));  // two blocks an SM, as the MoE GEMM's 64-row tiles
        config.blockDim = dim3(kThreads);
        config.stream = stream;
        config.attrs = &attribute;
        config.numAttrs = 1;
        config.dynamicSmemBytes = kSmemBytes;
        const uint8_t* layer = weights + l * real.layer_bytes + real.offset[p];
        check(cudaLaunchKernelEx(&config, phase_kernel, layer, ph->bytes[p], early), "phase launch");
      }
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    cudaGraphExec_t exec;
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    const float ms = median_of([&] { check(cudaGraphLaunch(exec, stream), "graph launch"); });
    report(c.what, *ph, ms);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // One persistent kernel, one and two blocks an SM, with and without the next phase's L2 requests.
  struct Run {
    const Phases* ph;
    int per_sm;
    bool early;
    const char* what;
  };
  for (const Run r : {Run{&bare, 1, false, "persistent, no bytes, 1 block an SM"},
                      Run{&bare, 2, false, "persistent, no bytes, 2 blocks an SM"},
                      Run{&real, 1, false, "persistent, 1 block an SM"},
                      Run{&real, 2, false, "persistent, 2 blocks an SM"},
                      Run{&real, 1, true, "persistent, 1 an SM, next copies before barrier"},
                      Run{&real, 2, true, "persistent, 2 an SM, next copies before barrier"}}) {
    int fit = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persistent_kernel, kThreads, kSmemBytes), "occupancy");
    if (fit < r.per_sm) {
      std::printf("%-44s skipped: %d blocks an SM fit\n", r.what, fit);
      continue;
    }
    const float ms = median_of([&] {
      persistent_kernel<<<sms * r.per_sm, kThreads, kSmemBytes, stream>>>(weights, *r.ph, r.early, sync, sync + 1);
      check(cudaGetLastError(), "persistent launch");
    });
    report(r.what, *r.ph, ms);
  }
  check(cudaDeviceSynchronize(), "end");
  return 0;
}
