// The last step of the MoE layer: expert outputs back to token order, weighted by the router (the
// decode path's already scaled split sums, or the prefill path's unscaled products). The output is
// BF16, or F32 under tensor parallelism (a rank's partial sum, rounded only after the all-reduce).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace nibble::cuda {

struct CombineArgs {
  const float* down;          // (splits, max_rows, H) in sorted-row order
  const int32_t* row_pos;     // (T·K)
  const float* topk_weights;  // (T, K)
  void* out;                  // out_dtype (T, H)
  DType out_dtype;            // BF16 or F32
  int64_t tokens;
  int64_t top_k;
  int64_t hidden;
  int64_t splits;
  int64_t max_rows;
};

void moe_combine(const CombineArgs& args, cudaStream_t stream);

// The prefill path's combine, one pass per window of padded rows [row_begin, row_end): the unscaled
// down product of those rows is scaled by row_scale[row] · channel_scale[expert][h], weighted by the
// router and added up per token. Passes over one call's windows, in order: kOnly when there is one
// window; else kFirst (acc = this window's part, every token), kMiddle (acc += it, tokens with a row
// here), kLast (out = acc + it, every token). A token's terms are added in a fixed order
// (window, then k), so the result does not depend on scheduling.
enum class CombinePass : uint8_t { kOnly, kFirst, kMiddle, kLast };

struct CombineRowsArgs {
  const float* down;           // (row_end - row_begin, H): unscaled product of the window's rows
  const void* down_bf16;       // the same in BF16, read when `down` is null
  const float* row_scale;      // (row_end - row_begin)
  const float* channel_scale;  // (E, H)
  const int32_t* pair_row;     // (T·K): padded row of pair t·K + k
  const int32_t* topk_ids;     // (T, K)
  const float* topk_weights;   // (T, K)
  float* acc;                  // (T, H) running sums over windows (unused by kOnly)
  void* out;                   // out_dtype (T, H), written by kOnly and kLast
  DType out_dtype;             // BF16 or F32
  int64_t row_begin;
  int64_t row_end;
  int64_t tokens;
  int64_t top_k;
  int64_t hidden;
  CombinePass pass;
};

void moe_combine_rows(const CombineRowsArgs& args, cudaStream_t stream);

}  // namespace nibble::cuda
