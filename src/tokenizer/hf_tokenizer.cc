// HfTokenizer: loading tokenizer.json/tokenizer_config.json and the encode/decode pipelines.
#include "tokenizer/hf_tokenizer.h"

#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

// bos_token etc.: a string, an AddedToken object {"content": ...}, or null/absent.
Result<std::optional<std::string>> TokenField(const nlohmann::json& config, const char* key,
                                              const std::string& where) {
  if (!config.contains(key) || config.at(key).is_null()) return std::optional<std::string>();
  const auto& v = config.at(key);
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object()) {
    DH_ASSIGN_OR_RETURN(std::string content, GetString(v, "content", where + "." + key));
    return std::optional<std::string>(std::move(content));
  }
  return InvalidArgument("{}.{}: expected a string or {{\"content\": ...}}, got {}", where, key,
                         v.type_name());
}

}  // namespace

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::Create(const nlohmann::json& tj,
                                                         const nlohmann::json& config_json,
                                                         const std::string& source) {
  const std::string file = source + "/tokenizer.json";
  if (!tj.is_object()) return InvalidArgument("{}: expected a JSON object", file);
  auto t = std::unique_ptr<HfTokenizer>(new HfTokenizer());
  const auto field = [&](const char* key) -> const nlohmann::json& {
    static const nlohmann::json kNull;
    return tj.contains(key) ? tj.at(key) : kNull;
  };
  if (!tj.contains("model")) return InvalidArgument("{}: missing \"model\"", file);
  auto model = BpeModel::Parse(tj.at("model"), "model");
  if (!model.ok()) return model.status().WithContext(file);
  t->model_ = std::move(model).value();
  auto normalizer = ParseNormalizer(field("normalizer"), "normalizer");
  if (!normalizer.ok()) return normalizer.status().WithContext(file);
  t->normalizer_ = std::move(normalizer).value();
  auto pre = ParsePreTokenizer(field("pre_tokenizer"), "pre_tokenizer");
  if (!pre.ok()) return pre.status().WithContext(file);
  t->pre_tokenizer_ = std::move(pre).value();
  auto post = ParsePostProcessor(field("post_processor"), "post_processor");
  if (!post.ok()) return post.status().WithContext(file);
  t->post_processor_ = std::move(post).value();
  auto decoder = ParseDecoder(field("decoder"), "decoder");
  if (!decoder.ok()) return decoder.status().WithContext(file);
  t->decoder_ = std::move(decoder).value();
  DH_RETURN_IF_ERROR(t->LoadAddedTokens(field("added_tokens")).WithContext(file));
  if (!config_json.is_null()) {
    DH_RETURN_IF_ERROR(t->LoadConfig(config_json, source + "/tokenizer_config.json"));
  }
  return t;
}

Status HfTokenizer::LoadAddedTokens(const nlohmann::json& list) {
  vocab_size_ = model_->id_limit();
  if (list.is_null()) return Status::Ok();
  if (!list.is_array()) return InvalidArgument("added_tokens: expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = fmt::format("added_tokens[{}]", i);
    const auto& e = list[i];
    AddedToken token;
    DH_ASSIGN_OR_RETURN(token.content, GetString(e, "content", at));
    DH_ASSIGN_OR_RETURN(const int64_t id, GetIntOr(e, "id", -1, at));
    if (id < 0 || id > INT32_MAX / 2)
      return InvalidArgument("{}.id: expected a non-negative id", at);
    token.id = static_cast<int32_t>(id);
    DH_ASSIGN_OR_RETURN(token.special, GetBoolOr(e, "special", false, at));
    DH_ASSIGN_OR_RETURN(token.lstrip, GetBoolOr(e, "lstrip", false, at));
    DH_ASSIGN_OR_RETURN(token.rstrip, GetBoolOr(e, "rstrip", false, at));
    DH_ASSIGN_OR_RETURN(token.normalized, GetBoolOr(e, "normalized", !token.special, at));
    DH_ASSIGN_OR_RETURN(token.single_word, GetBoolOr(e, "single_word", false, at));
    vocab_size_ = std::max(vocab_size_, token.id + 1);
    added_by_id_[token.id] = added_.size();
    added_by_content_.emplace(token.content, token.id);
    added_.push_back(std::move(token));
  }
  std::vector<int> raw_idx, norm_idx;
  std::vector<std::string> raw_pat, norm_pat;
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& token = added_[i];
    if (!token.normalized || normalizer_ == nullptr) {
      (token.normalized ? norm_idx : raw_idx).push_back(static_cast<int>(i));
      (token.normalized ? norm_pat : raw_pat).push_back(token.content);
      continue;
    }
    std::string pattern = token.content;
    DH_RETURN_IF_ERROR(normalizer_->Normalize(&pattern));
    norm_idx.push_back(static_cast<int>(i));
    norm_pat.push_back(std::move(pattern));
  }
  raw_matcher_.Build(&added_, raw_idx, raw_pat);
  normalized_matcher_.Build(&added_, norm_idx, norm_pat);
  return Status::Ok();
}

Status HfTokenizer::LoadConfig(const nlohmann::json& config, const std::string& file) {
  if (!config.is_object()) return InvalidArgument("{}: expected a JSON object", file);
  const std::string at = "tokenizer_config";
  struct Slot {
    const char* key;
    std::optional<std::string>* text;
    std::optional<int32_t>* id;
  };
  const Slot slots[] = {{"bos_token", &config_.bos_token, &config_.bos_token_id},
                        {"eos_token", &config_.eos_token, &config_.eos_token_id},
                        {"pad_token", &config_.pad_token, &config_.pad_token_id},
                        {"unk_token", &config_.unk_token, &config_.unk_token_id}};
  for (const Slot& slot : slots) {
    auto value = TokenField(config, slot.key, at);
    if (!value.ok()) return value.status().WithContext(file);
    *slot.text = *value;
    if (slot.text->has_value()) *slot.id = TokenToId(**slot.text);
  }
  auto add_bos = GetBoolOr(config, "add_bos_token", false, at);
  auto add_eos = GetBoolOr(config, "add_eos_token", false, at);
  if (!add_bos.ok()) return add_bos.status().WithContext(file);
  if (!add_eos.ok()) return add_eos.status().WithContext(file);
  config_.add_bos_token = *add_bos;
  config_.add_eos_token = *add_eos;
  if (config.contains("chat_template") && !config.at("chat_template").is_null()) {
    const auto& ct = config.at("chat_template");
    if (ct.is_string()) {
      config_.chat_templates["default"] = ct.get<std::string>();
    } else if (ct.is_array()) {
      for (size_t i = 0; i < ct.size(); ++i) {
        const std::string where = fmt::format("{}.chat_template[{}]", at, i);
        auto name = GetString(ct[i], "name", where);
        if (!name.ok()) return name.status().WithContext(file);
        auto text = GetString(ct[i], "template", where);
        if (!text.ok()) return text.status().WithContext(file);
        config_.chat_templates[*name] = *text;
      }
    } else {
      return InvalidArgument(
          "{}: chat_template: expected a string or a list of "
          "{{\"name\", \"template\"}}, got {}",
          file, ct.type_name());
    }
  }
  return Status::Ok();
}

Status HfTokenizer::EncodePlain(std::string_view text, bool at_input_start,
                                std::vector<int32_t>* ids) const {
  PieceList pieces;
  pieces.text.assign(text);
  if (normalizer_ != nullptr) DH_RETURN_IF_ERROR(normalizer_->Normalize(&pieces.text));
  // Normalized added tokens are matched on the normalized text.
  std::vector<Segment> segments;
  if (normalized_matcher_.empty()) {
    segments.push_back({0, pieces.text.size(), -1});
  } else {
    segments = normalized_matcher_.Split(pieces.text);
  }
  const std::string normalized = std::move(pieces.text);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
      continue;
    }
    if (seg.end == seg.begin) continue;
    pieces.text.assign(normalized, seg.begin, seg.end - seg.begin);
    pieces.spans.assign(1, {0, pieces.text.size()});
    if (pre_tokenizer_ != nullptr) {
      DH_RETURN_IF_ERROR(pre_tokenizer_->Apply(&pieces, at_input_start && seg.begin == 0));
    }
    for (const auto& [b, e] : pieces.spans) {
      model_->Tokenize(std::string_view(pieces.text).substr(b, e - b), ids);
    }
  }
  return Status::Ok();
}

Result<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                 bool add_special_tokens) const {
  DH_RETURN_IF_ERROR(ValidateUtf8(text).WithContext("encode"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (raw_matcher_.empty()) {
    DH_RETURN_IF_ERROR(EncodePlain(text, true, &ids));
  } else {
    for (const Segment& seg : raw_matcher_.Split(text)) {
      if (seg.id >= 0) {
        ids.push_back(seg.id);
      } else {
        DH_RETURN_IF_ERROR(
            EncodePlain(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, &ids));
      }
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

Result<std::string> HfTokenizer::Decode(std::span<const int32_t> ids,
                                        bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      const AddedToken& token = added_[it->second];
      if (!(skip_special_tokens && token.special)) tokens.push_back(token.content);
      continue;
    }
    const std::string* token = model_->IdToToken(id);
    if (token == nullptr) {
      return OutOfRange("decode: token id {} at position {} is outside the vocabulary [0, {})", id,
                        i, vocab_size_);
    }
    tokens.push_back(*token);
  }
  if (decoder_ == nullptr) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) out.push_back(' ');
      out.append(tokens[i]);
    }
    return out;
  }
  DH_RETURN_IF_ERROR(decoder_->Decode(&tokens));
  std::string out;
  for (const auto& t : tokens) out.append(t);
  return out;
}

std::optional<int32_t> HfTokenizer::TokenToId(std::string_view token) const {
  if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
  return model_->TokenToId(token);
}

std::optional<std::string> HfTokenizer::IdToToken(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return added_[it->second].content;
  if (const std::string* token = model_->IdToToken(id)) return *token;
  return std::nullopt;
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  auto it = added_by_id_.find(id);
  return it != added_by_id_.end() && added_[it->second].special;
}

}  // namespace dh::tok
