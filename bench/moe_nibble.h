// The hook where nibble's own W4A8 MoE layer (src/cuda/moe.h) enters the benchmark.
// bench/CMakeLists.txt builds moe_nibble.cc when src/cuda/moe.cu exists, else moe_nibble_absent.cc.
#pragma once

#include <cstdint>
#include <memory>

#include "moe_variant.h"

namespace nibble::bench {

// Random INT4 expert weights and a random BF16 router for `shape`, uploaded with upload_moe_w4a8,
// and a workspace for `max_tokens`. Null when this binary was built without nibble's MoE. Its
// routing is its own router's softmax top-k over random logits (close to uniform), not the
// harness's routing: LayerInputs.routing only sizes the weight-bytes figure.
std::unique_ptr<MoeVariant> make_nibble_moe(const MoeShape& shape, int64_t max_tokens,
                                            uint64_t seed);

}  // namespace nibble::bench
