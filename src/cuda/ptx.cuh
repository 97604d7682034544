// Thin wrappers over the PTX instructions nibble's kernels use directly: asynchronous copies into
// shared memory and the tensor-core MMAs (FP8 e4m3 sm_89+, f16/bf16; nibble builds for sm_90a).
#pragma once

#include <cstdint>

namespace nibble::cuda::ptx {

__device__ inline uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; when `valid` is false the destination is zero-filled.
__device__ inline void cp_async_16(void* smem, const void* global, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(global),
               "r"(valid ? 16 : 0));
}

// Starts moving `bytes` (a multiple of 16, 16-byte aligned) of global memory into L2, asynchronously.
__device__ inline void prefetch_l2_bulk(const void* global, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(global), "r"(bytes) : "memory");
}

// mbarriers (shared memory, this CTA) and bulk copies that complete on them.
__device__ inline void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Makes initialized mbarriers visible to the asynchronous proxy (the bulk copies).
__device__ inline void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Arrives on `bar` and expects `bytes` more of asynchronous copies to complete on it in this phase.
__device__ inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Expects `bytes` more of asynchronous copies to complete on `bar` in this phase, without arriving.
__device__ inline void mbarrier_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
// Waits for the phase of `bar` with this parity to complete. Each try_wait may suspend the thread until
// the phase completes or a time limit passes: a hint of NIBBLE_MBARRIER_SUSPEND_NS ns, which ptxas turns
// into a NANOSLEEP.SYNCS between the tries (cuobjdump) rather than a YIELD, or the system's limit with
// -DNIBBLE_MBARRIER_SUSPEND_NS=0, or no suspension at all with a negative value (an experiment: test_wait
// in a spin loop). With the system's limit the wait loops of the MoE GEMM's consumers were
// a quarter of their executed instructions (eighth session); the hint was measured together with
// moe_gemm_w4a8.cu's lean consumer loop, which it is the default with.
#ifndef NIBBLE_MBARRIER_SUSPEND_NS
#define NIBBLE_MBARRIER_SUSPEND_NS 10000000
#endif
__device__ inline void mbarrier_wait_at(uint32_t bar, uint32_t parity);
__device__ inline void mbarrier_wait(uint64_t* bar, uint32_t parity) { mbarrier_wait_at(smem_address(bar), parity); }
// The same, `bar` given as its shared-memory address.
__device__ inline void mbarrier_wait_at(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    if constexpr (NIBBLE_MBARRIER_SUSPEND_NS < 0) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    } else if constexpr (NIBBLE_MBARRIER_SUSPEND_NS > 0) {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity), "r"(static_cast<uint32_t>(NIBBLE_MBARRIER_SUSPEND_NS))
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar), "r"(parity)
          : "memory");
    }
  }
}
// Arrives on `bar` (one of its expected arrivals), given as its shared-memory address or a pointer.
__device__ inline void mbarrier_arrive_at(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ inline void mbarrier_arrive(uint64_t* bar) { mbarrier_arrive_at(smem_address(bar)); }
// Arrives on `bar` once this thread's earlier cp.async copies have landed (counted in the barrier's
// expected arrivals: noinc).
__device__ inline void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// The executing warpgroup's registers a thread set to kRegs (a multiple of 8, 24..256), released to
// or taken from the block's pool (setmaxnreg: every warp of the warpgroup executes it; an increase
// waits until the pool holds enough).
template <int kRegs>
__device__ inline void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ inline void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Barrier `id` (1..15) over `threads` threads of the block (a multiple of 32).
__device__ inline void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// This warp's arrival on barrier `id` over `threads` threads, without waiting for the others.
__device__ inline void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// `bytes` (a multiple of 16, both ends 16-byte aligned) global -> shared, completing on `bar`.
__device__ inline void bulk_copy_to_shared(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_address(smem)),
      "l"(global), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

// The same, with an L2 policy that evicts these bytes first (data read once: streamed weights).
__device__ inline void bulk_copy_to_shared_evict_first(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 policy;\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
      "policy;\n}\n" ::"r"(smem_address(smem)),
      "l"(global), "r"(bytes), "r"(smem_address(bar))
      : "memory");
}

// A box of a 2-D tensor map (`map`: a __grid_constant__ kernel parameter's address) at element
// coordinates (x along the inner dimension, y) -> shared memory, completing on `bar`.
__device__ inline void tensor_copy_2d_to_shared(void* smem, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_address(smem)),
      "l"(map), "r"(x), "r"(y), "r"(smem_address(bar))
      : "memory");
}

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8×8 16-bit matrices from shared memory (lane t gives the address of row t % 8 of matrix t / 8);
// r[i] is matrix i's fragment (row t / 4, columns 2·(t % 4), +1), or its transpose's with _trans.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// d (16×8 f32) += a (16×32 e4m3, row-major fragments) · b (32×8 e4m3, column-major fragments).
__device__ inline void mma_e4m3_16x8x32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d (16×8 f32) += a (16×16 f16, row-major fragments) · b (16×8 f16, column-major fragments).
__device__ inline void mma_f16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same with bf16 inputs.
__device__ inline void mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Programmatic dependent launch (sm_90; launch.h). A kernel launched with the PDL attribute may start
// while the previous kernel in its stream still runs: it waits here until that grid has completed and
// its memory is visible, before its first global access. A no-op when launched without the attribute.
__device__ inline void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Lets the next kernel in the stream be scheduled now (it still waits in grid_dependency_wait for this
// grid to complete); without it, that happens as this grid's blocks exit. A build with
// -DNIBBLE_PDL_EARLY_TRIGGER=OFF (an experiment) leaves it out everywhere.
#ifndef NIBBLE_PDL_EARLY_TRIGGER
#define NIBBLE_PDL_EARLY_TRIGGER 1
#endif
__device__ inline void launch_dependents() {
#if NIBBLE_PDL_EARLY_TRIGGER
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
// The grid dependency wait with the dependents' launch after it, or before it where the kernel's
// site triggers first (launch.h: trigger_first).
__device__ inline void dependency_wait(bool trigger_first) {
  if (trigger_first) launch_dependents();
  grid_dependency_wait();
  if (!trigger_first) launch_dependents();
}

}  // namespace nibble::cuda::ptx
