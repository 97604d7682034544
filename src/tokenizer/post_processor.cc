// Post-processor implementations (see post_processor.h).
#include "tokenizer/post_processor.h"

#include "core/error.h"

namespace nibble::tok {
namespace {

constexpr std::string_view kSupported =
    "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence";

// Ids before and after the sequence.
class Surround final : public PostProcessor {
 public:
  Surround(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

class Nothing final : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_template(const Json& json, std::string_view where,
                                             const JsonContext& context) {
  const std::string single_at = path_join(where, "single");
  const Json& single = context.member(json, "single", where);
  if (!single.is_array()) context.fail_at(single_at, "expected an array");
  const std::string specials_at = path_join(where, "special_tokens");
  const Json& specials = context.member(json, "special_tokens", where);
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string at = path_index(single_at, i);
    const Json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      const std::string id =
          context.string_member(piece["Sequence"], "id", path_join(at, "Sequence"));
      if (id != "A" || seen_sequence) context.fail_at(at, "the single template takes $A once");
      seen_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const std::string name =
          context.string_member(piece["SpecialToken"], "id", path_join(at, "SpecialToken"));
      const Json& special = context.member(specials, name.c_str(), specials_at);
      const Json& ids = context.member(special, "ids", path_join(specials_at, name));
      if (!ids.is_array())
        context.fail_at(path_join(path_join(specials_at, name), "ids"), "expected an array");
      for (const Json& id : ids) {
        if (!id.is_number_integer()) {
          context.fail_at(path_join(path_join(specials_at, name), "ids"), "expected integers");
        }
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    } else {
      context.fail_at(at, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    }
  }
  if (!seen_sequence) context.fail_at(single_at, "the single template lacks $A");
  return std::make_unique<Surround>(std::move(before), std::move(after));
}

// BertProcessing / RobertaProcessing: "cls": [token, id], "sep": [token, id].
int32_t pair_id(const Json& json, const char* key, std::string_view where,
                const JsonContext& context) {
  const Json& pair = context.member(json, key, where);
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
    context.fail_at(path_join(where, key), "expected [token, id]");
  }
  return pair[1].get<int32_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const Json& json, std::string_view where,
                                                   const JsonContext& context) {
  if (json.is_null()) return nullptr;
  const std::string type = context.type_of(json, where);
  if (type == "TemplateProcessing") return make_template(json, where, context);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<Surround>(std::vector<int32_t>{pair_id(json, "cls", where, context)},
                                      std::vector<int32_t>{pair_id(json, "sep", where, context)});
  }
  if (type == "ByteLevel") return std::make_unique<Nothing>();
  if (type == "Sequence") {
    const std::string list_at = path_join(where, "processors");
    const Json& list = context.member(json, "processors", where);
    if (!list.is_array()) context.fail_at(list_at, "expected an array");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_post_processor(list[i], path_index(list_at, i), context);
      if (step != nullptr) steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  context.unsupported(where, type, kSupported);
}

}  // namespace nibble::tok
