// Ops: the contract every backend implements (src/cpu is the plain reference, src/cuda the fast one).
// The model's forward pass is written once against this interface. Tensors are (tokens, features)
// row-major; weights are as in weights.h. Outputs are written into tensors the caller allocated with
// `empty`, so a backend can run a step from preallocated memory (CUDA graphs) without allocating
// inside it.
//
// Dtypes: the residual stream x and the sublayer outputs y (o_proj, MoE: the sums added to x) are F32
// on every backend and never rounded, so a tensor-parallel sum of F32 partials equals one rank's sum
// up to fp32 summation order. What the GEMMs read and attention works on (a norm's output h, qkv, the
// attention output) is in the backend's activation dtype: F32 on the CPU, BF16 on CUDA (and on the
// CPU twin Bf16ActivationOps). Every op computes in fp32 and rounds once, when it stores an output
// in BF16 (round to nearest even). Logits are F32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/tensor.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace nibble {

class Communicator;  // model/communicator.h

// The expert activation applied to the gate: SiLU, exact (erf) GELU, or GELU's tanh approximation
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
enum class Activation : uint8_t { kSilu, kGelu, kGeluTanh };
enum class RouterNorm : uint8_t { kRenormalize, kNone };  // rescale the top-k weights to sum to one

struct MoeParams {
  int64_t top_k = 2;
  RouterNorm router_norm = RouterNorm::kRenormalize;
  Activation activation = Activation::kSilu;
  float router_softcap = 0.0f;  // router logits become cap·tanh(logit / cap) before the softmax; 0 = off
  // Tensor parallelism (each rank holds a slice of the intermediate size): the down projection's FP8
  // input scale is per row from the row's amax over all ranks (all_reduce_max), as on one rank.
  // Null on one rank. Not owned.
  Communicator* communicator = nullptr;
};

struct AttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float softmax_scale = 0.0f;  // usually 1 / sqrt(head_dim)
  float k_scale = 1.0f;        // FP8 KV-cache scales of this layer
  float v_scale = 1.0f;
  float logit_softcap = 0.0f;  // scaled logits become cap·tanh(logit / cap) before the softmax; 0 = off
};

// Each row's sampling for Ops::sample: R values a tensor, where the logits are.
struct SampleSettings {
  Tensor temperatures;  // F32; 0: the argmax
  Tensor keys;          // I64: the draw's key (a uint64's bits)
  Tensor top_k;         // I32; 0: no limit. Undefined: none for any row
  Tensor top_p;         // F32; 1: no limit. Undefined: none for any row
};

// Each row's penalties for Ops::penalize (core/logit_penalties.h), its seen tokens in CSR form.
struct PenaltySettings {
  Tensor row_offsets;  // I32 (R + 1): row r's seen tokens are entries row_offsets[r] .. row_offsets[r + 1] - 1
  Tensor tokens;       // I32 (N): distinct within a row
  Tensor generated;    // I32 (N): how often the row's sequence generated the token, or kNotSeen, kBanned
  Tensor bias;         // F32 (N): the token's logit_bias
  Tensor penalties;    // F32 (R, 3): repetition, frequency, presence
};

// A step recorded once and replayed with no host work in between (a CUDA graph). It reads and writes
// the same device tensors at every replay: refill its inputs in place (copy_to_device) before replay().
class RecordedStep {
 public:
  virtual ~RecordedStep() = default;
  virtual void replay() = 0;
};

// Free and total bytes of a backend's memory: the GPU's, or the host's on the CPU backend.
struct MemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;

  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;

  // Memory. `empty` contents are unspecified. upload/download copy between the CPU and the device.
  virtual Tensor empty(DType dtype, Shape shape) = 0;
  virtual Tensor upload(const Tensor& host) = 0;
  virtual Tensor download(const Tensor& device_tensor) = 0;
  virtual MemoryInfo memory_info() const = 0;
  // Puts a layer's MoE weights (CPU tensors, the formats of weights.h) on the device in the layout
  // this backend's `moe` reads; by default each tensor is uploaded as it is. The loader calls it.
  virtual MoeWeights prepare_moe(const MoeWeights& host);
  // dst (on this backend) = host (same dtype and element count), queued after the work before it.
  virtual void copy_to_device(const Tensor& host, Tensor& dst);
  // Records the device work `step` queues, for replay; nullptr where the backend cannot record (CPU).
  virtual std::unique_ptr<RecordedStep> record(const std::function<void()>& step);
  // out (R) I32 = the index of the largest value of each row of x (R, V) F32, ties to the lowest
  // index (greedy sampling where the logits are: a step downloads R ids instead of R·V logits). The
  // default works on host tensors (CPU backend).
  virtual void argmax(const Tensor& x, Tensor& out);
  // out (R) I32 = a token for each row of logits (R, V) F32: its argmax where the row's temperature is
  // 0, else the Gumbel-max draw from softmax(row / temperature) under its key among the tokens its
  // top-k and top-p keep (filtered_gumbel_argmax in core/sampling_filter.h). The default works on
  // host tensors (CPU backend).
  virtual void sample(const Tensor& logits, const SampleSettings& settings, Tensor& out);
  // logits (R, V) F32, in place: each row's seen tokens take its penalties (penalized_logit in
  // core/logit_penalties.h), before argmax or sample. The default works on host tensors (CPU backend).
  virtual void penalize(Tensor& logits, const PenaltySettings& settings);

  // out (T, H) F32 = table[ids] for ids (T) I32 and table (V, H) BF16 (exact: BF16 values).
  virtual void embedding(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // out (T, H) in the activation dtype = x / rms(x) × weight, for x (T, H) F32 (the residual stream,
  // or Grok-1's sublayer output y) and weight (H) BF16: inv = 1 / sqrt(Σx² / H + eps) in fp32, then
  // x · inv · weight, rounded once.
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) = 0;
  // x (T, H) F32 += y (T, H): y F32 (a sublayer's sum, under tensor parallelism over the ranks) or in
  // the activation dtype (Grok-1's post-norm output). Nothing is rounded.
  virtual void add(Tensor& x, const Tensor& y) = 0;
  // x += y, then out = rms_norm(x, weight, eps): the residual add and the norm after it, which a
  // backend may fuse (the default calls add then rms_norm). out may be y itself (Grok-1's post-norm
  // output added to x and then replaced by the next norm's output).
  virtual void add_rms_norm(Tensor& x, const Tensor& y, const Tensor& weight, float eps, Tensor& out);
  // group.all_reduce_sum(y), then add_rms_norm(x, y, weight, eps, out): the tensor-parallel sum of a
  // layer's partial outputs and the residual add + RMSNorm after it, which a backend may fuse (the
  // default runs the two). With post_weight (sandwich norms), the sum is first normalized:
  // rms_norm(y, *post_weight, eps, out), then add_rms_norm(x, out, weight, eps, out). Afterwards y holds
  // this rank's values or the sum.
  virtual void all_reduce_add_rms_norm(Communicator& group, Tensor& y, Tensor& x, const Tensor* post_weight,
                                       const Tensor& weight, float eps, Tensor& out);
  // What follows a sublayer (group null on one rank): y's sum over the group's ranks (where there is a
  // group), then the residual add and the next norm, as all_reduce_add_rms_norm states (with
  // post_weight, Grok-1's sandwich norms: out = rms_norm(y, *post_weight), then add_rms_norm(x, out,
  // weight, eps, out)). Not virtual: the ops it calls are.
  void reduce_add_rms_norm(Communicator* group, Tensor& y, Tensor& x, const Tensor* post_weight,
                           const Tensor& weight, float eps, Tensor& out);
  // x *= factor, for F32 x (the residual stream, logits), any shape.
  virtual void scale(Tensor& x, float factor) = 0;
  // out (T, out_features) = x (T, in_features) · Wᵀ, x in the activation dtype; quantized formats
  // quantize x to FP8 first. out in the activation dtype (qkv) or F32 (o_proj's y).
  // row_group (tensor parallelism, a row-parallel linear such as o_proj): x holds this rank's slice
  // of each row, and a dynamic FP8 scale comes from the row's amax over every rank's slice (an
  // all_reduce_max), so that each rank quantizes exactly as one GPU holding the whole row would.
  virtual void linear(const Tensor& x, const Linear& w, Tensor& out, Communicator* row_group = nullptr) = 0;
  // out (R, N) F32 = rows `rows` (R) I32 of x (T, in) times Wᵀ: the lm_head on the rows that need logits.
  virtual void logits(const Tensor& x, const Tensor& rows, const Linear& w, Tensor& out) = 0;
  // Neox-style rotary embedding, in place, on the q and k parts of qkv (T, (Hq + 2·Hkv)·D) in the
  // activation dtype at `positions` (T) I32: angle = position · inv_freq[i] in fp32, inv_freq[i] =
  // fp32(1 / theta^(2i / D)).
  virtual void rope(Tensor& qkv, const Tensor& positions, const AttentionParams& params,
                    double theta) = 0;
  // Writes the k and v parts of qkv into `cache` at batch.slot_mapping, then causal attention of
  // each query over its sequence's cached keys (GQA: query head h reads kv head h / (Hq / Hkv));
  // qkv and out (T, Hq·D) both in the activation dtype.
  virtual void attention(const Tensor& qkv, KvCacheLayer& cache, KvCacheDType cache_dtype,
                         const ForwardBatch& batch, const AttentionParams& params,
                         Tensor& out) = 0;
  // rope(qkv, batch.positions, params, theta), then attention: the rotary embedding and the KV append
  // after it, which a backend may fuse (the default calls rope then attention). The cache and out are
  // as after rope then attention; qkv's q and k columns may be left rotated or not.
  virtual void rope_attention(Tensor& qkv, double theta, KvCacheLayer& cache, KvCacheDType cache_dtype,
                              const ForwardBatch& batch, const AttentionParams& params, Tensor& out);
  // The whole MoE layer: route, experts (gate_up, activation · up, down), weighted combine. x (T, H)
  // in the activation dtype; out (T, H) F32 (y; under tensor parallelism a rank's partial sum) or in
  // the activation dtype.
  virtual void moe(const Tensor& x, const MoeWeights& w, const MoeParams& params, Tensor& out) = 0;
};

}  // namespace nibble
