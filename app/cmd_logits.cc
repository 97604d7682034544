// `nibble logits`: one forward pass over the given ids; float32 [T, vocab] logits to a .npy file.
#include <iostream>
#include <sstream>

#include "commands.h"
#include "core/npy.h"
#include "engine/generator.h"

namespace nibble {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    check(used == item.size() && !item.empty() && value >= 0 && value <= INT32_MAX, "--ids: \"", item,
          "\" is not a token id");
    ids.push_back(static_cast<int32_t>(value));
  }
  check(!ids.empty(), "--ids is empty");
  return ids;
}

}  // namespace

int run_logits(const Commands& c) {
  const std::vector<int32_t> ids = parse_ids(c.ids);
  LoadedModel loaded = load_model(c.model);
  const auto vocab = loaded.model->config().vocab_size;
  for (int32_t id : ids) check(id < vocab, "--ids: token id ", id, " is outside the vocabulary (", vocab, ")");
  Generator generator(*loaded.model, static_cast<int64_t>(ids.size()), loaded.kv_dtype);
  const Tensor logits = generator.extend(ids, static_cast<int64_t>(ids.size()));
  write_npy(c.out, logits);
  std::cerr << "wrote " << c.out << " " << shape_str(logits.shape()) << "\n";
  return 0;
}

}  // namespace nibble
