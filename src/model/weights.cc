// Names of weight formats, for messages and reports.
#include "model/weights.h"

namespace nibble {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8: return "fp8";
    case WeightFormat::kInt4: return "int4";
  }
  return "?";
}

}  // namespace nibble
