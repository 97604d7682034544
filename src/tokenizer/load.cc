// Tokenizer::load: reads tokenizer.json and builds each component, refusing what nibble does not
// implement with one line that names the file and the component. "truncation" and "padding" are
// ignored: the engine decides lengths itself.
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/json_context.h"
#include "tokenizer/json_reader.h"
#include "tokenizer/tokenizer_impl.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using tok::Json;
using tok::JsonContext;

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  check(in.good(), file.string(), ": cannot open tokenizer file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  check(!in.bad(), file.string(), ": cannot read tokenizer file");
  return std::move(buffer).str();
}

std::vector<tok::AddedToken> read_added_tokens(const Json& root, const JsonContext& context) {
  std::vector<tok::AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) context.fail_at("added_tokens", "expected an array");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const Json& entry = (*it)[i];
    const std::string at = tok::path_index("added_tokens", i);
    tok::AddedToken token;
    token.content = context.string_member(entry, "content", at);
    // Defaults are those of tokenizers' AddedToken.
    token.single_word = context.bool_member(entry, "single_word", at, false);
    token.lstrip = context.bool_member(entry, "lstrip", at, false);
    token.rstrip = context.bool_member(entry, "rstrip", at, false);
    token.normalized = context.bool_member(entry, "normalized", at, true);
    token.special = context.bool_member(entry, "special", at, false);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

const Json& optional_member(const Json& root, const char* key) {
  static const Json kNull;
  const auto it = root.find(key);
  return it == root.end() ? kNull : *it;
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> Tokenizer::Impl::from_json_file(const fs::path& file) {
  const JsonContext context{file.string()};
  tok::TokenizerJson parsed = tok::parse_tokenizer_json(read_file(file), context);
  const Json& root = parsed.root;
  if (!root.is_object()) fail(file.string(), ": expected a JSON object at the top level");
  if (root.contains("version") && root["version"] != "1.0") {
    context.fail_at("version", cat("unknown tokenizer.json version ", root["version"].dump(),
                                   " (expected \"1.0\")"));
  }

  auto impl = std::make_unique<Impl>();
  const Json& model = context.member(root, "model", "");
  // Old files may leave out the model type; `tokenizers` then recognizes BPE by its merges.
  const std::string model_type =
      model.is_object() && !model.contains("type") && model.contains("merges")
          ? std::string("BPE")
          : context.type_of(model, "model");
  if (model_type != "BPE") context.unsupported("model", model_type, "BPE");
  impl->model = tok::BpeModel::from_json(model, std::move(parsed.bpe), "model", context);
  impl->normalizer =
      tok::make_normalizer(optional_member(root, "normalizer"), "normalizer", context);
  impl->pre_tokenizer =
      tok::make_pre_tokenizer(optional_member(root, "pre_tokenizer"), "pre_tokenizer", context);
  impl->post_processor =
      tok::make_post_processor(optional_member(root, "post_processor"), "post_processor", context);
  impl->decoder = tok::make_decoder(optional_member(root, "decoder"), "decoder", context);
  impl->added.add(read_added_tokens(root, context), *impl->model, impl->normalizer.get());

  // As tokenizers' get_vocab_size(with_added_tokens=True).
  int64_t overlapping = 0;
  for (const auto& [content, id] : impl->added.by_content()) {
    if (impl->model->token_to_id(content)) ++overlapping;
  }
  impl->vocab_size = impl->model->size() + static_cast<int64_t>(impl->added.size()) - overlapping;
  return impl;
}

Tokenizer Tokenizer::load(const fs::path& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) {
    const fs::path file = path / "tokenizer.json";
    check(fs::exists(file, error), path.string(), ": no tokenizer.json in this directory");
    return Tokenizer(Impl::from_json_file(file));
  }
  check(fs::exists(path, error), path.string(), ": tokenizer file not found");
  return Tokenizer(Impl::from_json_file(path));
}

}  // namespace nibble
