// Post-processor implementations (see post_processor.h).
#include "tokenizer/post_processor.h"

#include "tokenizer/json_fields.h"

namespace dh::tok {
namespace {

// A template: each item is either the input sequence (empty ids, is_sequence) or fixed ids.
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplatePostProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void Process(std::vector<int32_t>* ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids->size() + items_.size());
    for (const Item& item : items_) {
      if (item.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    *ids = std::move(out);
  }

 private:
  std::vector<Item> items_;
};

class NoOpPostProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*) const override {}
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& p : parts_) p->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> Own(PostProcessor* p) { return std::unique_ptr<PostProcessor>(p); }

Result<std::unique_ptr<PostProcessor>> ParseTemplate(const nlohmann::json& spec,
                                                     const std::string& at) {
  if (!spec.contains("single") || !spec.at("single").is_array()) {
    return InvalidArgument("{}.single: expected an array", at);
  }
  const auto& specials =
      spec.contains("special_tokens") ? spec.at("special_tokens") : nlohmann::json::object();
  std::vector<TemplatePostProcessor::Item> items;
  const auto& single = spec.at("single");
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string where = fmt::format("{}.single[{}]", at, i);
    const auto& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      items.push_back({true, {}});
      continue;
    }
    if (!piece.is_object() || !piece.contains("SpecialToken")) {
      return InvalidArgument("{}: expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}",
                             where);
    }
    DH_ASSIGN_OR_RETURN(const std::string name, GetString(piece.at("SpecialToken"), "id", where));
    if (!specials.is_object() || !specials.contains(name)) {
      return InvalidArgument("{}: special token \"{}\" is not in special_tokens", where, name);
    }
    const auto& entry = specials.at(name);
    if (!entry.is_object() || !entry.contains("ids") || !entry.at("ids").is_array()) {
      return InvalidArgument("{}.special_tokens[\"{}\"].ids: expected an array", at, name);
    }
    TemplatePostProcessor::Item item{false, {}};
    for (const auto& id : entry.at("ids")) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return InvalidArgument("{}.special_tokens[\"{}\"].ids: expected non-negative ids", at,
                               name);
      }
      item.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    items.push_back(std::move(item));
  }
  return Own(new TemplatePostProcessor(std::move(items)));
}

// Bert/Roberta: "cls": [token, id], "sep": [token, id]; single = cls A sep.
Result<std::unique_ptr<PostProcessor>> ParseClsSep(const nlohmann::json& spec,
                                                   const std::string& at) {
  int32_t ids[2];
  const char* keys[2] = {"cls", "sep"};
  for (int k = 0; k < 2; ++k) {
    const auto* v = spec.contains(keys[k]) ? &spec.at(keys[k]) : nullptr;
    if (v == nullptr || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer()) {
      return InvalidArgument("{}.{}: expected [token, id]", at, keys[k]);
    }
    ids[k] = (*v)[1].get<int32_t>();
  }
  std::vector<TemplatePostProcessor::Item> items = {
      {false, {ids[0]}}, {true, {}}, {false, {ids[1]}}};
  return Own(new TemplatePostProcessor(std::move(items)));
}

}  // namespace

Result<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& spec,
                                                          const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<PostProcessor>();
  DH_ASSIGN_OR_RETURN(const std::string type, GetType(spec, where));
  const std::string at = where + "(" + type + ")";
  if (type == "ByteLevel") return Own(new NoOpPostProcessor());
  if (type == "TemplateProcessing") return ParseTemplate(spec, at);
  if (type == "BertProcessing" || type == "RobertaProcessing") return ParseClsSep(spec, at);
  if (type == "Sequence") {
    if (!spec.contains("processors") || !spec.at("processors").is_array()) {
      return InvalidArgument("{}: expected an array \"processors\"", at);
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    const auto& list = spec.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      DH_ASSIGN_OR_RETURN(
          auto part, ParsePostProcessor(list[i], at + ".processors[" + std::to_string(i) + "]"));
      if (part) parts.push_back(std::move(part));
    }
    return Own(new SequencePostProcessor(std::move(parts)));
  }
  return Unsupported("{}: unsupported post-processor type \"{}\"", where, type);
}

}  // namespace dh::tok
