// The tiny fixtures unquantized on CUDA against their float32 torch references (Hugging Face
// transformers for Mixtral, tools/make_tiny_grok1.py written from xai-org/grok-1's model.py): the same
// bounds the CPU backend meets (relative L2 ≤ 1e-2 per position, same argmax, same greedy tokens).
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
  std::cout << f.dir << " on CUDA, bf16 vs torch fp32: worst per-position relative L2 " << c.worst << ", mean "
            << c.mean << "\n";
  EXPECT_LE(c.worst, 1e-2);
  EXPECT_EQ(c.argmax_diff, 0);
  if (reference.contains("greedy_32")) {
    const auto expected = reference["greedy_32"].get<std::vector<int32_t>>();
    EXPECT_EQ(generate(model, ids, 32, {}, KvCacheDType::kBf16, {}), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaReference,
                         ::testing::Values(Fixture{"tests/fixtures/tiny-mixtral", "tests/fixtures/tiny-mixtral-logits.npy",
                                                   "tests/fixtures/tiny-mixtral-reference.json"},
                                           Fixture{"tests/fixtures/tiny-grok1", "tests/fixtures/tiny-grok1-logits.npy",
                                                   "tests/fixtures/tiny-grok1-reference.json"}));

}  // namespace
}  // namespace nibble
