// A pre-quantized (Quark W4A8KV8) checkpoint on the CUDA backend. The tiny fixtures' checkpoints
// are written on the CPU (calibrate + write_quark_checkpoint, what `nibble quantize` runs) and
// loaded with CudaOps: without their static scales the logits equal online quantization's on CUDA;
// with them (static FP8 input scales on the attention projections, per-layer FP8 KV scales) they
// match the CPU twin with BF16 activations as closely as online quantization does: within twice the
// fixture's own sensitivity to one BF16 rounding (the CPU twin in F32 against BF16 activations), as
// CudaTinyMixtral measures it (FP8 activations make a random tiny MoE flip experts).
#include <gtest/gtest.h>

#include <iostream>

#include "cpu/bf16_activations.h"
#include "cpu/cpu_ops.h"
#include "cuda/cuda_ops.h"
#include "gpu_test_util.h"
#include "model/quark_test_util.h"

namespace nibble {
namespace {

struct Case {
  const char* model;
  const char* reference;
  KvCacheDType kv;
};

class CudaQuark : public ::testing::TestWithParam<Case> {};

// Logits of every position of the fixture's prompt.
Tensor prompt_logits(Model& model, const Case& c) {
  const auto ids = test::read_json(c.reference)["ids"].get<std::vector<int32_t>>();
  Generator g(model, static_cast<int64_t>(ids.size()), c.kv);
  return g.extend(ids, static_cast<int64_t>(ids.size()));
}

double worst_row(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t r = 0; r < a.dim(0); ++r)
    worst = std::max(worst, testing::rel_l2(a.data<float>() + r * a.dim(1),
                                            b.data<float>() + r * a.dim(1), a.dim(1)));
  return worst;
}

TEST_P(CudaQuark, MatchesOnlineAndTheCpuTwin) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  test::TempDir dir("cuda-quark");
  const auto path = dir.path() / "q";
  test::write_quantized(c.model, c.reference, path, WeightFormat::kInt4);
  const ModelConfig source_config = load_model_config(c.model), config = load_model_config(path);
  const Checkpoint source = Checkpoint::open(c.model), quantized = Checkpoint::open(path);

  cuda::CudaOps gpu;
  Model online(source_config,
               load_weights(source, source_config, Quantization::kQuarkInt4Fp8Moe, gpu), gpu);
  Model plain(config, load_quark_weights(quantized, config, gpu, nullptr, StaticScales::kIgnore),
              gpu);
  Model calibrated(config, load_quark_weights(quantized, config, gpu, nullptr, StaticScales::kUse),
                   gpu);
  Bf16ActivationOps cpu;  // the CPU twin with the GPU's activation precision
  Model twin(config, load_quark_weights(quantized, config, cpu, nullptr, StaticScales::kUse), cpu);
  CpuOps cpu_f32;
  Model twin_f32(config, load_quark_weights(quantized, config, cpu_f32, nullptr, StaticScales::kUse), cpu_f32);

  const double same_weights = worst_row(prompt_logits(online, c), prompt_logits(plain, c));
  const Tensor twin_logits = prompt_logits(twin, c);
  const double vs_cpu = worst_row(twin_logits, prompt_logits(calibrated, c));
  const double floor = worst_row(twin_logits, prompt_logits(twin_f32, c));
  std::cout << c.model << (c.kv == KvCacheDType::kFp8E4M3 ? ", fp8 kv" : ", bf16 kv")
            << ": cuda quark (no static scales) vs cuda online, worst relative L2 " << same_weights
            << "; cuda vs cpu twin with static scales " << vs_cpu << " (cpu f32 vs bf16 activations " << floor
            << ")\n";
  EXPECT_LE(same_weights, 1e-5);
  EXPECT_LE(vs_cpu, 2.0 * floor + 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, CudaQuark,
    ::testing::Values(Case{"tests/fixtures/tiny-grok1", "tests/fixtures/tiny-grok1-reference.json",
                           KvCacheDType::kBf16},
                      Case{"tests/fixtures/tiny-grok1", "tests/fixtures/tiny-grok1-reference.json",
                           KvCacheDType::kFp8E4M3},
                      Case{"tests/fixtures/tiny-mixtral",
                           "tests/fixtures/tiny-mixtral-reference.json", KvCacheDType::kFp8E4M3}));

}  // namespace
}  // namespace nibble
