// ChatTemplate: the public face of the Jinja interpreter, plus tokenizer_config.json reading.
#include "chat/chat_template.h"

namespace dh::chat {
namespace {

template <typename Json>
Result<std::string> RenderJson(const std::shared_ptr<const jinja::Template>& tmpl,
                               const Json& context, const ChatTemplateLimits& limits) {
  if (!context.is_object()) {
    return InvalidArgument("chat template context must be a JSON object, got {}",
                           context.type_name());
  }
  DH_ASSIGN_OR_RETURN(jinja::Value vars, jinja::ValueFromJson(context));
  return jinja::Render(tmpl, vars, limits);
}

template <typename Json>
Result<std::string> TokenString(const Json& config, const char* field) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->template get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->template get<std::string>();
  }
  return InvalidArgument(
      "tokenizer_config.json: '{}' must be a string or an object with a string "
      "'content'",
      field);
}

template <typename Json>
Result<ChatTemplateConfig> ConfigFromJson(const Json& config, std::string_view name) {
  if (!config.is_object()) return InvalidArgument("tokenizer_config.json: expected a JSON object");
  ChatTemplateConfig out;
  DH_ASSIGN_OR_RETURN(out.bos_token, TokenString(config, "bos_token"));
  DH_ASSIGN_OR_RETURN(out.eos_token, TokenString(config, "eos_token"));
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return NotFound("tokenizer_config.json has no 'chat_template'");
  }
  if (it->is_string()) {
    out.chat_template = it->template get<std::string>();
    return out;
  }
  if (!it->is_array()) {
    return InvalidArgument(
        "tokenizer_config.json: 'chat_template' must be a string or a list of "
        "{{name, template}}");
  }
  std::string available;
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return InvalidArgument(
          "tokenizer_config.json: 'chat_template' entries must be {{\"name\": "
          "string, \"template\": string}}");
    }
    const std::string entry_name = entry["name"].template get<std::string>();
    if (entry_name == name) {
      out.chat_template = entry["template"].template get<std::string>();
      return out;
    }
    available += (available.empty() ? "" : ", ") + entry_name;
  }
  return NotFound("tokenizer_config.json: no chat template named '{}' (have: {})", name, available);
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  ChatTemplate t;
  DH_ASSIGN_OR_RETURN(t.tmpl_, jinja::ParseTemplate(source));
  t.source_ = std::make_shared<const std::string>(source);
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& context,
                                         const ChatTemplateLimits& limits) const {
  return RenderJson(tmpl_, context, limits);
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                         const ChatTemplateLimits& limits) const {
  return RenderJson(tmpl_, context, limits);
}

Result<std::string> RenderChatTemplate(std::string_view tmpl, const nlohmann::json& context,
                                       const ChatTemplateLimits& limits) {
  DH_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  return t.Render(context, limits);
}

Result<std::string> RenderChatTemplate(std::string_view tmpl, const nlohmann::ordered_json& context,
                                       const ChatTemplateLimits& limits) {
  DH_ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  return t.Render(context, limits);
}

Result<ChatTemplateConfig> ChatTemplateFromTokenizerConfig(const nlohmann::json& config,
                                                           std::string_view name) {
  return ConfigFromJson(config, name);
}

Result<ChatTemplateConfig> ChatTemplateFromTokenizerConfig(const nlohmann::ordered_json& config,
                                                           std::string_view name) {
  return ConfigFromJson(config, name);
}

}  // namespace dh::chat
