// `nibble bench-one-batch`: SGLang's bench_one_batch on nibble's model runner. One static batch of
// random prompts: a prefill of all batch × input_len tokens in one step (in chunks only when the
// activations would not fit in the memory kept free), then output_len − 1 greedy decode steps, each
// timed on the host around ModelRunner::run (which returns sampled tokens, so every step ends
// synchronized). A short warm-up round (same batch and prompts, at most 32 outputs) runs first.
// Figures follow SGLang: prefill throughput = batch·input_len / latency, decode = batch / latency,
// total = batch·(input_len + output_len) / (prefill + every decode step). Each decode step is also
// set against its roofline: the bytes it must read (memory_plan.h decode_step_bytes) over a copy
// bandwidth measured in this run (device-to-device on the GPU, host memcpy on the CPU).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "model/memory_plan.h"
#ifdef NIBBLE_HAS_CUDA
#include "cuda/copy_bandwidth.h"
#include "cuda/profiler_range.h"
#endif

namespace nibble {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kBlockSize = 16;
constexpr int64_t kWarmupOutputLen = 32;  // SGLang's warm-up: min(32, output_len)
constexpr int64_t kPromptVocab = 10000;   // SGLang draws prompt ids from [0, 10000)

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Bandwidth {
  double gb_per_s = 0.0;  // GB = 1e9 bytes
  std::string source;
};

Bandwidth host_copy_bandwidth() {
  constexpr std::size_t kBytes = std::size_t{128} << 20;
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  std::vector<double> seconds;
  for (int i = 0; i < 6; ++i) {
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    if (i > 0) seconds.push_back(seconds_since(start));  // the first one warms up
    src[i] = dst[kBytes - 1 - i];                        // keep the copies observable
  }
  return {.gb_per_s = 2.0 * kBytes / median(seconds) / 1e9, .source = "host memcpy"};
}

Bandwidth copy_bandwidth(const LoadedModel& m) {
#ifdef NIBBLE_HAS_CUDA
  if (m.ops->device() == Device::kCuda) {
    const int64_t bytes = std::min<int64_t>(int64_t{1} << 30, m.ops->memory_info().free_bytes / 8);
    return {.gb_per_s = cuda::measure_copy_bandwidth(bytes, 20, nullptr).gb_per_s,
            .source = "device copy"};
  }
#endif
  (void)m;
  return host_copy_bandwidth();
}

struct RunResult {
  double prefill_latency = 0.0;
  int64_t prefill_steps = 0;
  std::vector<double> decode_latencies;
  std::vector<std::vector<int32_t>> outputs;  // the tokens each sequence generated
};

// The decode step (0-based) that NIBBLE_PROFILE_DECODE_STEP names, or -1: in the timed round that
// step runs between cuda::profiler_start and profiler_stop, for `ncu --profile-from-start off`
// (scripts/gpu-check profile).
int64_t profiled_decode_step() {
  const char* env = std::getenv("NIBBLE_PROFILE_DECODE_STEP");
  return env != nullptr && *env != '\0' ? std::atoll(env) : -1;
}

enum class ProfilerMark : uint8_t { kStart, kStop };

// Nsight Compute's profiler range around the profiled step (CUDA builds; nothing elsewhere).
void profiler_mark(ProfilerMark mark) {
#ifdef NIBBLE_HAS_CUDA
  if (mark == ProfilerMark::kStart)
    cuda::profiler_start();
  else
    cuda::profiler_stop();
#else
  (void)mark;
#endif
}

// One round: prefill in steps of at most `chunk` tokens (a sequence may span steps), then decode;
// decode step `profile_step` (or none: -1) inside a profiler range.
RunResult run_once(ModelRunner& runner, BlockManager& blocks,
                   const std::vector<std::vector<int32_t>>& prompts, int64_t output_len,
                   int64_t chunk, int64_t profile_step = -1) {
  const RequestParams params{
      .sampling = {}, .max_tokens = output_len, .stop_token_ids = {}, .ignore_eos = true};
  std::vector<Sequence> seqs;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    seqs.emplace_back(static_cast<int64_t>(i), prompts[i], params);
  RunResult r;
  const auto finish_step = [](const std::vector<ScheduledSeq>& step,
                              const std::vector<int32_t>& sampled) {
    std::size_t next = 0;
    for (const ScheduledSeq& s : step) {
      s.seq->num_computed_tokens += s.new_tokens;
      if (s.samples) s.seq->append(sampled.at(next++));
    }
  };
  for (std::size_t i = 0; i < seqs.size();) {  // prefill
    std::vector<ScheduledSeq> step;
    int64_t budget = chunk;
    for (; i < seqs.size() && budget > 0; budget -= step.back().new_tokens) {
      Sequence& seq = seqs[i];
      const int64_t remaining = seq.num_tokens() - seq.num_computed_tokens;
      const int64_t n = std::min(remaining, budget);
      step.push_back({&seq, n, n == remaining});
      if (n == remaining) ++i;
    }
    const auto start = Clock::now();
    for (const ScheduledSeq& s : step) blocks.append_slots(*s.seq, s.new_tokens);
    finish_step(step, runner.run(step));
    r.prefill_latency += seconds_since(start);
    ++r.prefill_steps;
  }
  for (int64_t t = 0; t + 1 < output_len; ++t) {  // decode
    std::vector<ScheduledSeq> step;
    for (Sequence& seq : seqs) step.push_back({&seq, 1, true});
    if (t == profile_step) profiler_mark(ProfilerMark::kStart);
    const auto start = Clock::now();
    for (const ScheduledSeq& s : step) blocks.append_slots(*s.seq, 1);
    finish_step(step, runner.run(step));
    r.decode_latencies.push_back(seconds_since(start));
    if (t == profile_step) profiler_mark(ProfilerMark::kStop);
  }
  for (const Sequence& seq : seqs)
    r.outputs.emplace_back(seq.tokens().begin() + seq.num_prompt_tokens(), seq.tokens().end());
  for (Sequence& seq : seqs) blocks.release(seq);
  return r;
}

// The most prefill tokens one step may compute: all of them, unless their activations would not fit
// in the memory mem_fraction_static leaves free.
int64_t prefill_chunk(const LoadedModel& m, const ModelOptions& o, int64_t batch, int64_t tokens) {
  const ModelConfig& c = m.model->config();
  const auto reserve = static_cast<int64_t>(static_cast<double>(m.ops->memory_info().total_bytes) *
                                            (1.0 - o.mem_fraction_static));
  if (step_activation_bytes(c, tokens, batch) <= reserve) return tokens;
  const int64_t per_token = step_activation_bytes(c, 2, batch) - step_activation_bytes(c, 1, batch);
  const int64_t fits = (reserve - step_activation_bytes(c, 0, batch)) / per_token;
  return std::clamp<int64_t>(fits / kBlockSize * kBlockSize, kBlockSize, tokens);
}

std::vector<std::vector<int32_t>> random_prompts(int64_t batch, int64_t len, int64_t vocab,
                                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> id(
      0, static_cast<int32_t>(std::min(vocab, kPromptVocab) - 1));
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(len));
  for (auto& p : prompts)
    for (int32_t& t : p) t = id(rng);
  return prompts;
}

void print_run(const BenchOptions& b, const RunResult& r) {
  char line[200];
  std::snprintf(line, sizeof line, "Prefill. latency: %8.5f s, throughput: %10.2f token/s%s\n",
                r.prefill_latency,
                static_cast<double>(b.batch_size * b.input_len) / r.prefill_latency,
                r.prefill_steps > 1 ? cat(" (", r.prefill_steps, " chunks)").c_str() : "");
  std::cout << line;
  for (std::size_t i = 0; i < r.decode_latencies.size() && i < 5; ++i) {
    std::snprintf(line, sizeof line,
                  "Decode %zu. Batch size: %lld, latency: %8.5f s, throughput: %10.2f token/s\n", i,
                  static_cast<long long>(b.batch_size), r.decode_latencies[i],
                  static_cast<double>(b.batch_size) / r.decode_latencies[i]);
    std::cout << line;
  }
}

}  // namespace

int run_bench_one_batch(const Commands& c) {
  const BenchOptions& b = c.bench;
  check(b.batch_size >= 1 && b.input_len >= 1 && b.output_len >= 1,
        "--batch-size, --input-len and --output-len must be positive");
  LoadedModel loaded = load_model(c.model);
  const ModelConfig& config = loaded.model->config();
  const int64_t seq_len = b.input_len + b.output_len;
  check(seq_len <= config.max_position_embeddings, "--input-len ", b.input_len,
        " plus --output-len ", b.output_len, " exceeds the model's context of ",
        config.max_position_embeddings, " tokens");
  const Bandwidth bandwidth = copy_bandwidth(loaded);  // before the KV cache takes the free memory

  const int64_t chunk = prefill_chunk(loaded, c.model, b.batch_size, b.batch_size * b.input_len);
  const int64_t blocks_per_seq = (seq_len + kBlockSize - 1) / kBlockSize;
  const int64_t needed = b.batch_size * blocks_per_seq * kBlockSize;
  const int64_t kv_tokens = kv_cache_tokens(loaded, c.model,
                                            {.block_size = kBlockSize,
                                             .largest_step_tokens = chunk,
                                             .max_logit_rows = b.batch_size,
                                             .want_tokens = needed,
                                             .min_tokens = needed});
  ModelRunner runner(*loaded.model, kv_tokens / kBlockSize, kBlockSize, loaded.kv_dtype,
                     {.cuda_graphs = c.model.cuda_graphs(), .max_graph_batch = std::max<int64_t>(b.batch_size, 1),
                      .max_context = 0});
  BlockManager blocks(kv_tokens / kBlockSize, kBlockSize);
  const auto prompts = random_prompts(b.batch_size, b.input_len, config.vocab_size, b.seed);

  std::cout << "Warmup ..." << std::endl;
  const auto warmup_start = Clock::now();
  run_once(runner, blocks, prompts, std::min(kWarmupOutputLen, b.output_len), chunk);
  std::cout << "Warmup done in " << seconds_since(warmup_start) << " s\nBenchmark ..." << std::endl;
  const RunResult r = run_once(runner, blocks, prompts, b.output_len, chunk, profiled_decode_step());
  print_run(b, r);

  // Figures, each decode step against its roofline. Under --tp-size N, `config` is rank 0's shard (its
  // heads, KV heads and intermediate size): the bytes are what one GPU reads, over one GPU's copy
  // bandwidth (GPU 0's, measured above); the replicated embedding, norms, routers and lm_head whole.
  const ModelShape shape = model_shape(config);
  const auto batch = static_cast<double>(b.batch_size);
  nlohmann::json steps = nlohmann::json::array();
  std::vector<double> ratios, achieved;
  double total = r.prefill_latency;
  for (std::size_t i = 0; i < r.decode_latencies.size(); ++i) {
    const double latency = r.decode_latencies[i];
    const int64_t context = b.batch_size * (b.input_len + 1 + static_cast<int64_t>(i));
    const DecodeBytes bytes =
        decode_step_bytes(shape, loaded.quantization, loaded.kv_dtype, b.batch_size, context);
    const double roofline = static_cast<double>(bytes.total()) / (bandwidth.gb_per_s * 1e9);
    ratios.push_back(latency / roofline);
    achieved.push_back(static_cast<double>(bytes.total()) / latency / 1e9);
    steps.push_back({{"latency", latency},
                     {"throughput", batch / latency},
                     {"weight_bytes", bytes.weights},
                     {"kv_bytes", bytes.kv},
                     {"bytes_read", bytes.total()},
                     {"roofline_latency", roofline},
                     {"roofline_ratio", latency / roofline},
                     {"achieved_gb_per_s", achieved.back()}});
    total += latency;
  }
  const DecodeBytes first =
      decode_step_bytes(shape, loaded.quantization, loaded.kv_dtype, b.batch_size, 0);
  nlohmann::json out = {
      {"run_name", b.run_name},
      {"model_path", c.model.model_path},
      {"load_format", c.model.load_format},
      {"quantization", quantization_name(loaded.quantization)},
      {"kv_cache_dtype", loaded.kv_dtype == KvCacheDType::kFp8E4M3 ? "fp8_e4m3" : "bf16"},
      {"device", c.model.device},
      {"tp_size", c.model.tp_size},
      {"batch_size", b.batch_size},
      {"input_len", b.input_len},
      {"output_len", b.output_len},
      {"prefill_latency", r.prefill_latency},
      {"prefill_throughput", batch * static_cast<double>(b.input_len) / r.prefill_latency},
      {"prefill_steps", r.prefill_steps},
      {"decode", steps},
      {"total_latency", total},
      {"overall_throughput", batch * static_cast<double>(seq_len) / total},
      {"copy_bandwidth_gb_per_s", bandwidth.gb_per_s},
      {"bandwidth_source", bandwidth.source},
      {"decode_weight_bytes", first.weights},
      {"expected_active_experts", first.active_experts},
      {"kv_cache_tokens", kv_tokens},
      {"output_ids", r.outputs}};
  char line[240];
  if (!r.decode_latencies.empty()) {
    const double med = median(r.decode_latencies);
    out["median_decode_latency"] = med;
    out["median_decode_throughput"] = batch / med;
    out["median_decode_roofline_ratio"] = median(ratios);
    out["median_decode_achieved_gb_per_s"] = median(achieved);
    std::snprintf(line, sizeof line,
                  "Decode.  median latency: %8.5f s, median throughput: %10.2f token/s\n", med,
                  batch / med);
    std::cout << line;
  }
  std::snprintf(line, sizeof line, "Total. latency: %8.3f s, throughput: %10.2f token/s\n", total,
                batch * static_cast<double>(seq_len) / total);
  std::cout << line;
  std::snprintf(line, sizeof line,
                "Roofline. a decode step reads %s of weights%s (%.2f of %lld experts active per "
                "layer) plus its KV "
                "cache; %s bandwidth %.1f GB/s\n",
                format_gb(first.weights).c_str(), c.model.tp_size > 1 ? " per GPU" : "", first.active_experts,
                static_cast<long long>(shape.num_experts), bandwidth.source.c_str(),
                bandwidth.gb_per_s);
  std::cout << line;
  if (!ratios.empty()) {
    std::snprintf(line, sizeof line,
                  "Roofline. median decode step at %.2fx its roofline, %.1f GB/s achieved\n",
                  median(ratios), median(achieved));
    std::cout << line;
  }
  if (!b.json.empty()) {
    std::ofstream file(b.json);
    check(file.good(), "--json ", b.json, ": cannot write the file");
    file << out.dump(2) << "\n";
    check(file.good(), "--json ", b.json, ": writing failed");
  }
  return 0;
}

}  // namespace nibble
