// Table and JSON output of nibble-bench-moe.
#include "report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <ostream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace nibble::bench {
namespace {

std::string format(const char* pattern, auto... values) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), pattern, values...);
  return buffer;
}

nlohmann::json result_json(const LayerResult& r, const Ceilings& c) {
  nlohmann::json j{{"variant", r.variant},
                   {"tokens", r.tokens},
                   {"active_experts", r.active_experts},
                   {"weight_bytes", r.weight_bytes},
                   {"flops", r.flops}};
  if (!r.error.empty()) {
    j["error"] = r.error;
    return j;
  }
  j["time_us_median"] = r.time.median_us;
  j["time_us_min"] = r.time.min_us;
  j["reps"] = r.time.reps;
  j["cuda_graph"] = r.time.graph;
  if (!r.time.note.empty()) j["capture_note"] = r.time.note;
  j["gb_per_s"] = r.gb_per_s();
  j["pct_of_copy"] = 100.0 * r.gb_per_s() / c.copy_gb_per_s;
  j["tflop_per_s"] = r.tflop_per_s();
  j["pct_of_fp8_gemm"] = 100.0 * r.tflop_per_s() / c.fp8_tflop_per_s;
  return j;
}

}  // namespace

void print_report(const BenchReport& report, std::ostream& out) {
  const MoeShape& s = report.shape;
  const Ceilings& c = report.ceilings;
  out << "nibble-bench-moe on " << report.device << ", " << report.date << "\n"
      << "shape: hidden " << s.hidden_size << ", expert inter " << s.intermediate_size
      << ", experts " << s.num_experts << ", top-k " << s.top_k << "\n"
      << format(
             "ceilings: copy %.0f GB/s (%.1f GiB device-to-device, read + write), "
             "FP8 GEMM %lld^3 %.0f TFLOP/s (cuBLASLt e4m3, fp32 accumulate)\n",
             c.copy_gb_per_s, static_cast<double>(c.copy_bytes) / (1 << 30),
             static_cast<long long>(c.gemm_size), c.fp8_tflop_per_s);
  for (const CheckEntry& e : report.checks)
    out << format("check %-14s T=%-5lld tokens checked %lld: rel err %.2e (tolerance %.0e) %s\n",
                  e.variant.c_str(), static_cast<long long>(e.tokens),
                  static_cast<long long>(e.checked_tokens), e.relative_error, e.tolerance,
                  e.passed ? "ok" : "FAILED");
  out << "\n"
      << format("%7s  %-14s %9s %11s %10s %9s %6s %9s %6s  %s\n", "tokens", "variant", "experts",
                "time_us", "weight_MB", "GB/s", "%copy", "TFLOP/s", "%fp8", "timed as");
  int64_t last_tokens = -1;
  for (const LayerResult& r : report.results) {
    if (last_tokens >= 0 && r.tokens != last_tokens) out << "\n";
    last_tokens = r.tokens;
    const std::string experts = format("%lld/%lld", static_cast<long long>(r.active_experts),
                                       static_cast<long long>(s.num_experts));
    if (!r.error.empty()) {
      out << format("%7lld  %-14s %9s  error: %s\n", static_cast<long long>(r.tokens),
                    r.variant.c_str(), experts.c_str(), r.error.c_str());
      continue;
    }
    out << format("%7lld  %-14s %9s %11.1f %10.1f %9.0f %6.1f %9.1f %6.1f  %s\n",
                  static_cast<long long>(r.tokens), r.variant.c_str(), experts.c_str(),
                  r.time.median_us, r.weight_bytes / 1e6, r.gb_per_s(),
                  100.0 * r.gb_per_s() / c.copy_gb_per_s, r.tflop_per_s(),
                  100.0 * r.tflop_per_s() / c.fp8_tflop_per_s,
                  r.time.graph ? "graph" : "plain (capture refused)");
  }
  for (const std::string& note : report.notes) out << "note: " << note << "\n";
}

void write_json(const BenchReport& report, const std::string& path) {
  const MoeShape& s = report.shape;
  const Ceilings& c = report.ceilings;
  nlohmann::json j{{"device", report.device},
                   {"date", report.date},
                   {"shape",
                    {{"hidden_size", s.hidden_size},
                     {"intermediate_size", s.intermediate_size},
                     {"num_experts", s.num_experts},
                     {"num_experts_per_tok", s.top_k}}},
                   {"ceilings",
                    {{"copy_gb_per_s", c.copy_gb_per_s},
                     {"copy_bytes", c.copy_bytes},
                     {"fp8_gemm_tflop_per_s", c.fp8_tflop_per_s},
                     {"fp8_gemm_size", c.gemm_size}}},
                   {"results", nlohmann::json::array()},
                   {"checks", nlohmann::json::array()},
                   {"notes", report.notes}};
  for (const LayerResult& r : report.results) j["results"].push_back(result_json(r, c));
  for (const CheckEntry& e : report.checks)
    j["checks"].push_back({{"variant", e.variant},
                           {"tokens", e.tokens},
                           {"checked_tokens", e.checked_tokens},
                           {"relative_error", e.relative_error},
                           {"tolerance", e.tolerance},
                           {"passed", e.passed}});
  std::ofstream file(path);
  check(file.good(), "cannot write ", path);
  file << j.dump(2) << "\n";
  check(file.good(), "error writing ", path);
}

}  // namespace nibble::bench
