// The benchmark's results and their two outputs: the table on stdout, one row per token count and
// variant, in ratios to the ceilings measured in the same run; and the same numbers as JSON.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "ceilings.h"
#include "routing.h"
#include "timing.h"

namespace nibble::bench {

struct LayerResult {
  std::string variant;
  int64_t tokens = 0;
  int64_t active_experts = 0;  // experts with ≥ 1 token under the harness's routing
  double weight_bytes = 0.0;   // expert weights and scales read, active experts only
  double flops = 0.0;          // 2 · T·K · 3·H·I
  Measurement time;
  std::string error;  // non-empty: this variant failed at this token count

  double gb_per_s() const { return weight_bytes / (time.median_us * 1e-6) / 1e9; }
  double tflop_per_s() const { return flops / (time.median_us * 1e-6) / 1e12; }
};

struct CheckEntry {
  std::string variant;
  int64_t tokens = 0;          // tokens in the layer call
  int64_t checked_tokens = 0;  // tokens compared with the reference
  double relative_error = 0.0;
  double tolerance = 0.0;
  bool passed = false;
};

struct BenchReport {
  std::string device;
  std::string date;  // UTC, YYYY-MM-DD
  MoeShape shape;
  Ceilings ceilings;
  std::vector<LayerResult> results;
  std::vector<CheckEntry> checks;
  std::vector<std::string> notes;  // variants skipped, capture refusals, ...
};

void print_report(const BenchReport& report, std::ostream& out);
void write_json(const BenchReport& report, const std::string& path);

}  // namespace nibble::bench
