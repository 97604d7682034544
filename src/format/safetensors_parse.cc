// Validation of a safetensors header and file image. Pure functions over bytes: no I/O, so the fuzz
// target drives exactly this code. Anything malformed becomes a nibble::Error naming the source and
// the tensor; nlohmann::json's own exceptions never escape.
#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "format/json_brief.h"
#include "format/quote.h"
#include "format/safetensors_parse.h"

namespace nibble {
namespace {

using nlohmann::json;

std::string supported_dtypes() {
  std::string names;
  for (const auto& t : kDTypeTraits) names += cat(names.empty() ? "" : ", ", t.safetensors_name);
  return names;
}

// Parses the header, rejecting duplicate top-level keys (nlohmann would silently keep the last one,
// and two tensors with one name is a corrupt file, not a choice to make for the user).
json parse_header_json(std::string_view header, const std::string& source) {
  // nlohmann stops at a NUL as if the input ended, which would hide whatever follows it.
  check(header.find('\0') == std::string_view::npos, source,
        ": header is not valid JSON: it contains a NUL byte");
  std::set<std::string> seen;
  std::string duplicate;
  bool has_duplicate = false;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !has_duplicate) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen.insert(key).second) {
        duplicate = key;
        has_duplicate = true;
      }
    }
    return true;
  };
  json root;
  try {
    root = json::parse(header.begin(), header.end(), on_event);
  } catch (const json::exception& e) {
    fail(source, ": header is not valid JSON: ", printable(e.what()));
  }
  check(!has_duplicate, source, ": ", duplicate == "__metadata__" ? "" : "tensor ",
        quote_text(duplicate), " appears twice in the header");
  check(root.is_object(), source, ": header must be a JSON object, got ", root.type_name());
  return root;
}

std::map<std::string, std::string> parse_metadata(const json& value, const std::string& source) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  check(value.is_object(), source, ": __metadata__ must be an object of strings, got ",
        value.type_name());
  for (const auto& [key, item] : value.items()) {
    check(item.is_string(), source, ": __metadata__ ", quote_text(key), " must be a string, got ",
          item.type_name());
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

const json& field(const json& entry, const char* name, const std::string& where) {
  const auto it = entry.find(name);
  check(it != entry.end(), where, "missing \"", name, "\"");
  return *it;
}

DType parse_dtype(const json& value, const std::string& where) {
  check(value.is_string(), where, "\"dtype\" must be a string, got ", value.type_name());
  const auto& name = value.get_ref<const std::string&>();
  const auto dtype = dtype_from_name(name);
  check(dtype.has_value(), where, "unknown dtype ", quote_text(name),
        " (supported: ", supported_dtypes(), ")");
  return *dtype;
}

Shape parse_shape(const json& value, const std::string& where) {
  check(value.is_array(), where, "\"shape\" must be an array of integers, got ", value.type_name());
  Shape shape;
  shape.reserve(value.size());
  for (const auto& dim : value) {
    // nlohmann stores non-negative integers as unsigned, negative ones as signed, the rest as
    // float.
    if (dim.is_number_unsigned()) {
      const auto d = dim.get<uint64_t>();
      check(d <= static_cast<uint64_t>(INT64_MAX), where, "dimension ", d,
            " in \"shape\" is too large");
      shape.push_back(static_cast<int64_t>(d));
    } else if (dim.is_number_integer()) {
      fail(where, "negative dimension ", dim.get<int64_t>(), " in \"shape\"");
    } else {
      fail(where, "\"shape\" must hold non-negative integers, got ",
           dim.is_number() ? json_brief(dim) : std::string(dim.type_name()));
    }
  }
  return shape;
}

std::pair<uint64_t, uint64_t> parse_offsets(const json& value, const std::string& where) {
  const bool ok = value.is_array() && value.size() == 2 && value[0].is_number_unsigned() &&
                  value[1].is_number_unsigned();
  check(ok, where, "\"data_offsets\" must be two non-negative integers [begin, end], got ",
        value.is_array() ? json_brief(value) : std::string(value.type_name()));
  return {value[0].get<uint64_t>(), value[1].get<uint64_t>()};
}

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                       const std::string& source) {
  const std::string where = cat(source, ": tensor ", quote_text(name), ": ");
  check(entry.is_object(), where,
        "entry must be an object with dtype, shape and data_offsets, got ", entry.type_name());
  TensorInfo info;
  info.name = name;
  info.dtype = parse_dtype(field(entry, "dtype", where), where);
  info.shape = parse_shape(field(entry, "shape", where), where);
  std::tie(info.begin, info.end) = parse_offsets(field(entry, "data_offsets", where), where);

  // numel × size in 64 bits, refusing overflow (a lying shape must not wrap round to a small size).
  uint64_t bytes = dtype_size(info.dtype);
  uint64_t numel = 1;
  for (int64_t d : info.shape) {
    const bool overflow = __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
                          __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
    check(!overflow && numel <= static_cast<uint64_t>(INT64_MAX), where, "shape ",
          shape_str(info.shape), " × ", dtype_name(info.dtype), " overflows 64 bits");
  }
  const std::string offsets = cat("data_offsets [", info.begin, ", ", info.end, "]");
  check(info.begin <= info.end, where, offsets, " end before they begin");
  check(info.end - info.begin == bytes, where, offsets, " do not match shape ",
        shape_str(info.shape), " × ", dtype_name(info.dtype), " (", bytes, " bytes)");
  check(info.end <= data_size, where, offsets, " lie outside the data section (", data_size,
        " bytes)");
  return info;
}

// Sorts by offset and refuses any byte claimed by two tensors. Empty tensors own no bytes.
void sort_and_check_overlap(std::vector<TensorInfo>& tensors, const std::string& source) {
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const TensorInfo* previous = nullptr;
  for (const auto& t : tensors) {
    if (t.begin == t.end) continue;
    if (previous != nullptr)
      check(t.begin >= previous->end, source, ": tensors ", quote_text(previous->name), " [",
            previous->begin, ", ", previous->end, "] and ", quote_text(t.name), " [", t.begin, ", ",
            t.end, "] overlap");
    if (previous == nullptr || t.end > previous->end) previous = &t;
  }
}

}  // namespace

SafetensorsLayout parse_safetensors_header_full(std::string_view header, uint64_t data_size,
                                                const std::string& source) {
  const json root = parse_header_json(header, source);
  SafetensorsLayout layout;
  layout.data_size = data_size;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      layout.metadata = parse_metadata(entry, source);
    } else {
      layout.tensors.push_back(parse_entry(name, entry, data_size, source));
    }
  }
  sort_and_check_overlap(layout.tensors, source);
  return layout;
}

std::vector<TensorInfo> parse_safetensors_header(std::string_view header, uint64_t data_size,
                                                 const std::string& source) {
  return parse_safetensors_header_full(header, data_size, source).tensors;
}

SafetensorsLayout parse_safetensors_image(std::span<const std::byte> image,
                                          const std::string& source) {
  check(image.size() >= 8, source, ": file is ", image.size(),
        " bytes, too short for a safetensors header length (8 bytes)");
  uint64_t header_size = 0;  // little-endian on disk whatever the host
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(image[i]);
  const uint64_t rest = image.size() - 8;
  check(header_size <= rest, source, ": header length ", header_size, " exceeds the ", rest,
        " bytes after it (truncated, or not a safetensors file)");
  check(header_size <= kMaxSafetensorsHeaderBytes, source, ": header length ", header_size,
        " bytes is implausible (limit ", kMaxSafetensorsHeaderBytes, ")");
  const std::string_view header(reinterpret_cast<const char*>(image.data()) + 8, header_size);
  SafetensorsLayout layout = parse_safetensors_header_full(header, rest - header_size, source);
  layout.data_offset = 8 + header_size;
  return layout;
}

}  // namespace nibble
