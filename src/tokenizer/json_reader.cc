// SAX handler for tokenizer.json (see json_reader.h): builds the DOM like nlohmann's own parser,
// except for the values of model.vocab and model.merges, which it decodes as they arrive.
#include "tokenizer/json_reader.h"

#include "core/error.h"

namespace nibble::tok {
namespace {

class Reader final : public nlohmann::json_sax<Json> {
 public:
  Reader(TokenizerJson& out, const JsonContext& context) : out_(out), context_(context) {}

  const std::string& error() const { return error_; }

  bool null() override { return value(nullptr); }
  bool boolean(bool v) override { return value(v); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(v);
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v <= INT32_MAX ? static_cast<int64_t>(v) : -1);
    return value(v);
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (mode_ == Mode::kVocab) return vocab_id(-1);
    return value(v);
  }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) return merge_string(v);
    if (mode_ == Mode::kVocab) return vocab_id(-1);
    return value(v);
  }
  bool binary(binary_t& v) override { return value(v); }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::kDom) return bad_entry();
    if (at_model_member("vocab")) {
      mode_ = Mode::kVocab;
      out_.bpe.vocab.emplace();
      return true;
    }
    return open(Json::object());
  }
  bool key(string_t& k) override {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = k;
      return true;
    }
    if (mode_ != Mode::kDom) return bad_entry();
    last_key_ = k;
    pending_ = &(*stack_.back())[k];
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return true;
    }
    return close();
  }

  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ != 0) return bad_entry();
      merge_depth_ = 1;
      merge_parts_.clear();
      return true;
    }
    if (mode_ == Mode::kVocab) return vocab_id(-1);
    if (at_model_member("merges")) {
      mode_ = Mode::kMerges;
      merge_depth_ = 0;
      merge_index_ = 0;
      out_.bpe.merges.emplace();
      return true;
    }
    return open(Json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 0) {
        mode_ = Mode::kDom;
        return true;
      }
      merge_depth_ = 0;
      if (merge_parts_.size() != 2) return bad_entry();
      out_.bpe.merges->emplace_back(std::move(merge_parts_[0]), std::move(merge_parts_[1]));
      ++merge_index_;
      return true;
    }
    return close();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = cat(context_.file, ": invalid JSON: ", e.what());
    return false;
  }

 private:
  enum class Mode : uint8_t { kDom, kVocab, kMerges };

  // True when the value about to open is root.model.<member>.
  bool at_model_member(std::string_view member) const {
    return stack_.size() == 2 && path_[1] == "model" && stack_.back()->is_object() &&
           last_key_ == member;
  }

  template <typename V>
  Json* place(V&& v) {
    if (stack_.empty()) {
      out_.root = Json(std::forward<V>(v));
      return &out_.root;
    }
    Json* top = stack_.back();
    if (top->is_array()) {
      top->emplace_back(std::forward<V>(v));
      return &top->back();
    }
    *pending_ = Json(std::forward<V>(v));
    return pending_;
  }
  template <typename V>
  bool value(V&& v) {
    if (mode_ != Mode::kDom) return bad_entry();
    place(std::forward<V>(v));
    return true;
  }
  // Pointers to open containers stay valid: nothing is added to a parent while a child is open.
  bool open(Json container) {
    const bool parent_is_object = !stack_.empty() && stack_.back()->is_object();
    path_.push_back(parent_is_object ? last_key_ : std::string());
    stack_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  bool vocab_id(int64_t id) {
    if (id < 0 || id > INT32_MAX) {
      error_ =
          cat(context_.file, ": model.vocab.", vocab_key_, ": expected a non-negative 32-bit id");
      return false;
    }
    out_.bpe.vocab->emplace(vocab_key_, static_cast<int32_t>(id));
    return true;
  }

  bool merge_string(string_t& s) {
    if (merge_depth_ == 1) {
      merge_parts_.push_back(s);
      return true;
    }
    // Legacy "a b" form, as in merges.txt, whose "#version" header lines are skipped.
    const std::size_t space = s.find(' ');
    if (!s.starts_with("#version")) {
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return bad_entry();
      }
      out_.bpe.merges->emplace_back(s.substr(0, space), s.substr(space + 1));
    }
    ++merge_index_;
    return true;
  }

  bool bad_entry() {
    if (mode_ == Mode::kMerges) {
      error_ = cat(context_.file, ": model.merges[", merge_index_,
                   "]: expected \"a b\" or [\"a\", \"b\"]");
    } else {
      error_ =
          cat(context_.file, ": model.vocab.", vocab_key_, ": expected a non-negative 32-bit id");
    }
    return false;
  }

  TokenizerJson& out_;
  const JsonContext& context_;
  std::string error_;
  std::vector<Json*> stack_;       // open containers, outermost first
  std::vector<std::string> path_;  // the key each open container sits under ("" in arrays)
  std::string last_key_;
  Json* pending_ = nullptr;  // the object member named by the last key
  Mode mode_ = Mode::kDom;
  std::string vocab_key_;
  int merge_depth_ = 0;
  std::size_t merge_index_ = 0;
  std::vector<std::string> merge_parts_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(const std::string& text, const JsonContext& context) {
  TokenizerJson out;
  Reader reader(out, context);
  const bool ok = Json::sax_parse(text, &reader, nlohmann::detail::input_format_t::json, true);
  if (!ok) {
    fail(reader.error().empty() ? cat(context.file, ": invalid JSON") : reader.error());
  }
  return out;
}

}  // namespace nibble::tok
