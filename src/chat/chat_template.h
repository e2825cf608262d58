// Chat templates: parse a Hugging Face `chat_template` (Jinja) once, render it for many
// conversations. Sandboxed and bounded (see jinja_interpreter.h for the limits).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/jinja_interpreter.h"

namespace dh::chat {

using ChatTemplateLimits = jinja::RenderLimits;

class ChatTemplate {
 public:
  // Fails on syntax errors and on include/import/extends ("template line L, column C: ...").
  static Result<ChatTemplate> Parse(std::string_view source);

  // `context` is a JSON object: messages, tools, add_generation_prompt, bos_token, eos_token and
  // any extra variables (e.g. enable_thinking). Missing variables are undefined, as in Jinja.
  // Prefer ordered_json: nlohmann::json sorts object keys, Python keeps them in input order, and
  // `tools | tojson` shows the difference.
  Result<std::string> Render(const nlohmann::json& context,
                             const ChatTemplateLimits& limits = {}) const;
  Result<std::string> Render(const nlohmann::ordered_json& context,
                             const ChatTemplateLimits& limits = {}) const;

  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const jinja::Template> tmpl_;
  std::shared_ptr<const std::string> source_;
};

// Parse + render in one call.
Result<std::string> RenderChatTemplate(std::string_view tmpl, const nlohmann::json& context,
                                       const ChatTemplateLimits& limits = {});
Result<std::string> RenderChatTemplate(std::string_view tmpl, const nlohmann::ordered_json& context,
                                       const ChatTemplateLimits& limits = {});

// What a tokenizer_config.json says about chat templating.
struct ChatTemplateConfig {
  std::string chat_template;
  std::string bos_token;  // empty when absent or null
  std::string eos_token;
};

// Reads `chat_template` (a string, or a list of {name, template}: `name` picks one, "default"
// first) and bos/eos tokens (strings or {"content": ...}) from a parsed tokenizer_config.json.
Result<ChatTemplateConfig> ChatTemplateFromTokenizerConfig(const nlohmann::json& config,
                                                           std::string_view name = "default");
Result<ChatTemplateConfig> ChatTemplateFromTokenizerConfig(const nlohmann::ordered_json& config,
                                                           std::string_view name = "default");

}  // namespace dh::chat
