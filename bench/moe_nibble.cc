// nibble's W4A8 MoE layer as a benchmark variant: random INT4 weights in the loader's format,
// uploaded and repacked by upload_moe_w4a8, timed through moe_w4a8 on the harness's stream (in a CUDA
// graph for the decode path, plainly where moe_w4a8 takes its eager prefill path).
#include "moe_nibble.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device.h"
#include "cuda/moe.h"

namespace nibble::bench {
namespace {

// Random 32-bit words: eight random INT4 codes each, in the on-disk reorder packing.
Tensor random_packed(Shape shape, std::mt19937_64& rng) {
  Tensor t = Tensor::zeros(DType::kI32, std::move(shape));
  auto* words = t.data<uint32_t>();
  for (int64_t i = 0; i < t.numel(); i += 2) {
    const uint64_t bits = rng();
    words[i] = static_cast<uint32_t>(bits);
    if (i + 1 < t.numel()) words[i + 1] = static_cast<uint32_t>(bits >> 32);
  }
  return t;
}

// Scales turning codes in [-8, 7] into values of amplitude about sqrt(3 / fan_in).
Tensor random_scales(Shape shape, int64_t fan_in, std::mt19937_64& rng) {
  Tensor t = Tensor::zeros(DType::kF32, std::move(shape));
  std::uniform_real_distribution<float> spread(0.5f, 1.5f);
  const float base = std::sqrt(3.0f / static_cast<float>(fan_in)) / 7.0f;
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base * spread(rng);
  return t;
}

Tensor random_router(int64_t experts, int64_t hidden, std::mt19937_64& rng) {
  Tensor t = Tensor::zeros(DType::kBF16, {experts, hidden});
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  auto* bits = t.data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float f = value(rng);
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    bits[i] = static_cast<uint16_t>(u >> 16);  // truncation is fine for random data
  }
  return t;
}

MoeWeights random_int4_weights(const MoeShape& s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t experts = s.num_experts;
  const int64_t hidden = s.hidden_size;
  const int64_t inter = s.intermediate_size;
  MoeWeights w;
  w.router = random_router(experts, hidden, rng);
  w.experts = Experts{.format = WeightFormat::kInt4,
                      .num_experts = experts,
                      .hidden_size = hidden,
                      .intermediate_size = inter,
                      .gate_up = random_packed({experts, 2 * inter, hidden / 8}, rng),
                      .gate_up_scale = random_scales({experts, 2 * inter}, hidden, rng),
                      .down = random_packed({experts, hidden, inter / 8}, rng),
                      .down_scale = random_scales({experts, hidden}, inter, rng)};
  return w;
}

class NibbleMoe final : public MoeVariant {
 public:
  NibbleMoe(const MoeShape& shape, int64_t max_tokens, uint64_t seed)
      : s_(shape),
        weights_(cuda::upload_moe_w4a8(random_int4_weights(shape, seed))),
        workspace_(weights_, max_tokens, shape.top_k),
        out_(cuda::empty(DType::kBF16, {max_tokens, shape.hidden_size})) {}

  std::string name() const override { return "nibble-w4a8"; }

  // INT4 weights (half a byte each) and one fp32 scale per output row of each matrix.
  double weight_bytes(int64_t active_experts) const override {
    const auto h = static_cast<double>(s_.hidden_size);
    const auto i = static_cast<double>(s_.intermediate_size);
    return static_cast<double>(active_experts) *
           (3.0 * h * i / 2.0 + (2.0 * i + h) * sizeof(float));
  }

  LayerLaunch prepare(const LayerInputs& in) override {
    const Tensor x = Tensor::wrap(const_cast<void*>(in.x), DType::kBF16,
                                  {in.num_tokens, s_.hidden_size}, Device::kCuda, nullptr);
    Tensor out = out_.slice(0, in.num_tokens);
    const MoeParams params{.top_k = s_.top_k};
    // The engine runs such calls eagerly, through the prefill path (one host synchronization a call),
    // so they refuse the harness's graph capture and are timed plainly, as the engine runs them.
    const bool eager = cuda::moe_prefill_preferred(in.num_tokens, s_.top_k, s_.num_experts);
    return [this, x, out, params, eager](cudaStream_t stream) mutable {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      cuda_check(cudaStreamIsCapturing(stream, &status));
      check(!eager || status == cudaStreamCaptureStatusNone,
            "the prefill path (many tokens per expert) runs eagerly, not in a CUDA graph");
      cuda::moe_w4a8(x, weights_, params, workspace_, out, stream);
    };
  }

  const void* output() const override { return out_.raw(); }

 private:
  MoeShape s_;
  cuda::MoeWeightsW4A8 weights_;
  cuda::MoeWorkspace workspace_;
  Tensor out_;  // BF16 (max_tokens, H) on the device
};

}  // namespace

std::unique_ptr<MoeVariant> make_nibble_moe(const MoeShape& shape, int64_t max_tokens,
                                            uint64_t seed) {
  return std::make_unique<NibbleMoe>(shape, max_tokens, seed);
}

}  // namespace nibble::bench
