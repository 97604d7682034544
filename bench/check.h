// --check: a variant's layer output for a few tokens against an fp64 CPU reference computed from
// the variant's own weights (as the GPU sees them) and the shared routing. Catches wrong indexing,
// missing rows and NaNs; the tolerance is the variant's (its quantization error), not a precision
// claim.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "moe_variant.h"

namespace nibble::bench {

struct CheckResult {
  double relative_error = 0.0;  // ‖out − ref‖ / ‖ref‖ over the checked tokens
  double tolerance = 0.0;
  int64_t tokens = 0;
  bool passed() const { return relative_error <= tolerance; }  // false for NaN too
};

// Runs the layer once for `inputs` (output poisoned first) and checks `num_check` tokens: the first
// num_check − 1 and the last, whose rows sit at the start and the end of their experts' groups.
// Nothing when the variant offers no reference (nibble's own router decides its routing).
std::optional<CheckResult> check_variant(MoeVariant& variant, const MoeShape& shape,
                                         const LayerInputs& inputs, int64_t num_check,
                                         cudaStream_t stream);

}  // namespace nibble::bench
