// The tiny fixtures unquantized on CUDA against their float32 torch references (Hugging Face
// transformers for Mixtral, tools/make_tiny_grok1.py written from xai-org/grok-1's model.py): relative
// L2 of the logits ≤ 1e-2 and the same argmax at every position. The CPU backend computes in f32 and
// meets 1e-2 at every position; CUDA rounds activations to BF16 between ops, which alone moves single
// positions by up to ~1.2e-2 (measured on an H200, 2026-11-29: worst 0.0116 / 0.0117, mean 0.0078 /
// 0.0088), so positions are bounded at 2e-2 and the whole tensor at 1e-2. Greedy decoding is not
// compared here: on these random-weight fixtures the top logits are closer than that noise (tiny Mixtral's
// greedy tokens left torch's at the second token); test_cuda_model checks CUDA's greedy tokens against
// the CPU backend with the same BF16 activation rounding instead.
#include <gtest/gtest.h>

#include <iostream>

#include "core/npy.h"
#include "cuda/cuda_ops.h"
#include "gpu_test_util.h"
#include "model/fixture_test_util.h"

namespace nibble {
namespace {

struct Fixture {
  const char* dir;
  const char* logits;
  const char* reference;
};

class CudaReference : public ::testing::TestWithParam<Fixture> {};

TEST_P(CudaReference, Bf16MatchesTorch) {
  SKIP_WITHOUT_GPU();
  const Fixture f = GetParam();
  cuda::CudaOps gpu;
  const ModelConfig config = load_model_config(f.dir);
  Model model(config, load_weights(Checkpoint::open(f.dir), config, Quantization::kNone, gpu), gpu);
  const nlohmann::json reference = test::read_json(f.reference);
  const auto ids = reference["ids"].get<std::vector<int32_t>>();
  const test::Comparison c = test::compare(read_npy(f.logits), test::full_logits(model, ids, KvCacheDType::kBf16));
  std::cout << f.dir << " on CUDA, bf16 vs torch fp32: relative L2 " << c.whole << "; per position worst "
            << c.worst << ", mean " << c.mean << "\n";
  EXPECT_LE(c.whole, 1e-2);
  EXPECT_LE(c.worst, 2e-2);
  EXPECT_EQ(c.argmax_diff, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaReference,
                         ::testing::Values(Fixture{"tests/fixtures/tiny-mixtral", "tests/fixtures/tiny-mixtral-logits.npy",
                                                   "tests/fixtures/tiny-mixtral-reference.json"},
                                           Fixture{"tests/fixtures/tiny-grok1", "tests/fixtures/tiny-grok1-logits.npy",
                                                   "tests/fixtures/tiny-grok1-reference.json"}));

}  // namespace
}  // namespace nibble
