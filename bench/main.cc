// nibble-bench-moe: times the whole MoE layer (route -> gate_up -> activation -> down -> combine)
// on random data with uniform random routing, for nibble's W4A8 layer and two library baselines,
// and reports each against the copy bandwidth and FP8 GEMM rate measured in the same run (DESIGN.md
// §7).
#include <algorithm>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "baselines.h"
#include "ceilings.h"
#include "check.h"
#include "core/error.h"
#include "device_buffer.h"
#include "handles.h"
#include "moe_nibble.h"
#include "random_fill.h"
#include "report.h"
#include "routing.h"
#include "timing.h"

namespace nibble::bench {
namespace {

constexpr int64_t kCheckedTokens = 3;
constexpr int64_t kLargestCheckedCall = 256;  // --check runs the largest requested count up to this

const std::map<std::string, MoeShape> kShapes{
    {"mixtral", {.hidden_size = 4096, .intermediate_size = 14336, .num_experts = 8, .top_k = 2}},
    {"grok",
     {.hidden_size = 6144,
      .intermediate_size = 16384,
      .num_experts = 8,
      .top_k = 2}},  // per rank, TP2
    {"deepseek", {.hidden_size = 7168, .intermediate_size = 2048, .num_experts = 256, .top_k = 8}},
};

struct Options {
  MoeShape shape;
  std::vector<int64_t> tokens{1, 8, 32, 128, 256, 1024, 4096, 32768};
  std::vector<std::string> variants{"nibble", "bf16", "bf16-grouped", "fp8"};
  std::string json;
  uint64_t seed = 1;
  bool check = false;
};

std::unique_ptr<MoeVariant> make_variant(const std::string& name, const MoeShape& shape,
                                         int64_t max_tokens, uint64_t seed) {
  if (name == "nibble") return make_nibble_moe(shape, max_tokens, seed);
  if (name == "bf16") return make_bf16_moe(shape, max_tokens, GemmGrouping::kPerExpert, seed);
  if (name == "bf16-grouped") return make_bf16_moe(shape, max_tokens, GemmGrouping::kGrouped, seed);
  if (name == "fp8") return make_fp8_moe(shape, max_tokens, seed);
  fail("unknown variant '", name, "' (nibble, bf16, bf16-grouped, fp8)");
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[16];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d", &tm);
  return buffer;
}

void validate(const Options& o) {
  const MoeShape& s = o.shape;
  check(s.hidden_size > 0 && s.hidden_size % 16 == 0, "--hidden must be a positive multiple of 16");
  check(s.intermediate_size > 0 && s.intermediate_size % 16 == 0,
        "--inter must be a positive multiple of 16");
  check(s.num_experts > 0, "--experts must be positive");
  check(s.top_k > 0 && s.top_k <= s.num_experts, "--topk must be in [1, experts]");
  check(!o.tokens.empty(), "--tokens is empty");
  for (const int64_t t : o.tokens) check(t > 0, "--tokens: ", t, " is not a positive count");
}

// One token count's shared inputs: the routing, on the host and the device.
struct TokenCase {
  Routing routing;
  std::unique_ptr<DeviceRouting> device;
};

void run_variant(const std::string& name, const Options& o, const void* x,
                 const std::vector<TokenCase>& cases, cudaStream_t stream, std::size_t l2_bytes,
                 BenchReport& report) {
  const int64_t max_tokens = *std::max_element(o.tokens.begin(), o.tokens.end());
  std::unique_ptr<MoeVariant> variant = make_variant(name, o.shape, max_tokens, o.seed);
  if (!variant) {
    report.notes.push_back(
        name + ": not built into this binary (src/cuda/moe.cu absent at configure time)");
    return;
  }
  const auto inputs_of = [&](const TokenCase& c) {
    return LayerInputs{.num_tokens = c.routing.num_tokens,
                       .x = x,
                       .routing = &c.routing,
                       .device_routing = c.device.get()};
  };
  if (o.check) {
    const TokenCase* chosen = &cases.front();
    for (const TokenCase& c : cases)
      if (c.routing.num_tokens <= kLargestCheckedCall &&
          c.routing.num_tokens > chosen->routing.num_tokens)
        chosen = &c;
    if (const auto result =
            check_variant(*variant, o.shape, inputs_of(*chosen), kCheckedTokens, stream)) {
      report.checks.push_back({.variant = variant->name(),
                               .tokens = chosen->routing.num_tokens,
                               .checked_tokens = result->tokens,
                               .relative_error = result->relative_error,
                               .tolerance = result->tolerance,
                               .passed = result->passed()});
    } else {
      report.notes.push_back(variant->name() + ": no CPU reference (routes with its own router)");
    }
  }
  for (const TokenCase& c : cases) {
    const int64_t active = c.routing.active_experts();
    const auto& s = o.shape;
    LayerResult r{.variant = variant->name(),
                  .tokens = c.routing.num_tokens,
                  .active_experts = active,
                  .weight_bytes = variant->weight_bytes(active),
                  .flops = 2.0 * static_cast<double>(c.routing.num_rows()) * 3.0 *
                           static_cast<double>(s.hidden_size * s.intermediate_size),
                  .time = {},
                  .error = {}};
    try {
      r.time = time_layer(variant->prepare(inputs_of(c)), stream, TimingOptions{});
      if (!r.time.graph)
        report.notes.push_back(cat(r.variant, " T=", r.tokens,
                                   ": CUDA graph capture refused, timed plainly: ", r.time.note));
      if (r.weight_bytes < 2.0 * static_cast<double>(l2_bytes))
        report.notes.push_back(cat(r.variant, " T=", r.tokens, ": active weights (",
                                   r.weight_bytes / 1e6,
                                   " MB) under twice the L2; repeated runs may partly hit L2"));
    } catch (const Error& e) {
      r.error = e.what();
      (void)cudaGetLastError();
      cuda_check(cudaStreamSynchronize(stream));
    }
    report.results.push_back(std::move(r));
  }
}

int run(const Options& o) {
  validate(o);
  int devices = 0;
  check(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0, "no CUDA device");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0));

  BenchReport report;
  report.device = prop.name;
  report.date = today_utc();
  report.shape = o.shape;
  std::cerr << "measuring ceilings...\n";
  report.ceilings = measure_ceilings();

  std::vector<int64_t> tokens = o.tokens;
  std::sort(tokens.begin(), tokens.end());
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  const int64_t max_tokens = tokens.back();
  DeviceBuffer x(static_cast<std::size_t>(max_tokens * o.shape.hidden_size) *
                 2);  // BF16 (T_max, H)
  fill_uniform_bf16(x.get(), x.bytes() / 2, 1.0f, o.seed, nullptr);
  cuda_check(cudaDeviceSynchronize());
  std::vector<TokenCase> cases;
  for (const int64_t t : tokens) {
    Routing routing = uniform_routing(o.shape, t, o.seed);
    auto device = std::make_unique<DeviceRouting>(routing);
    cases.push_back({.routing = std::move(routing), .device = std::move(device)});
  }

  const Stream stream;
  for (const std::string& name : o.variants) {
    std::cerr << "timing " << name << "...\n";
    try {
      run_variant(name, o, x.get(), cases, stream.get(), static_cast<std::size_t>(prop.l2CacheSize),
                  report);
    } catch (const Error& e) {
      report.notes.push_back(name + ": failed: " + e.what());
    }
  }
  std::stable_sort(report.results.begin(), report.results.end(),
                   [](const LayerResult& a, const LayerResult& b) { return a.tokens < b.tokens; });
  print_report(report, std::cout);
  if (!o.json.empty()) write_json(report, o.json);
  const bool checks_passed = std::all_of(report.checks.begin(), report.checks.end(),
                                         [](const CheckEntry& e) { return e.passed; });
  return checks_passed ? 0 : 2;
}

}  // namespace
}  // namespace nibble::bench

int main(int argc, char** argv) {
  using nibble::bench::kShapes;
  nibble::bench::Options o;
  std::string shape_name;
  CLI::App app{
      "nibble-bench-moe: the whole MoE layer, nibble W4A8 against cuBLAS BF16 and cuBLASLt FP8"};
  app.add_option("--shape", shape_name,
                 "preset: mixtral, grok (per rank at TP2), deepseek; flags below override")
      ->check(CLI::IsMember({"mixtral", "grok", "deepseek"}));
  app.add_option("--hidden", o.shape.hidden_size, "hidden_size H");
  app.add_option("--inter", o.shape.intermediate_size, "expert intermediate_size I");
  app.add_option("--experts", o.shape.num_experts, "num_experts E");
  app.add_option("--topk", o.shape.top_k, "num_experts_per_tok K");
  app.add_option("--tokens", o.tokens, "token counts, comma-separated")->delimiter(',');
  app.add_option("--variants", o.variants, "nibble, bf16, bf16-grouped, fp8 (comma-separated)")
      ->delimiter(',');
  app.add_option("--json", o.json, "also write the results as JSON to this file");
  app.add_option("--seed", o.seed, "seed of the random data and routing");
  app.add_flag("--check", o.check, "compare each baseline with an fp64 CPU reference first");
  try {
    app.parse(argc, argv);
    if (!shape_name.empty()) {
      // A preset fills only what the command line left unset.
      const nibble::bench::MoeShape preset = kShapes.at(shape_name);
      auto& s = o.shape;
      if (app.count("--hidden") == 0) s.hidden_size = preset.hidden_size;
      if (app.count("--inter") == 0) s.intermediate_size = preset.intermediate_size;
      if (app.count("--experts") == 0) s.num_experts = preset.num_experts;
      if (app.count("--topk") == 0) s.top_k = preset.top_k;
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return nibble::bench::run(o);
  } catch (const nibble::Error& e) {
    std::cerr << "nibble-bench-moe: " << e.what() << "\n";
    return 1;
  }
}
