// Jinja chat-template rendering for the server, and template discovery.
#include "server/template_renderer.h"

#include <filesystem>

#include "base/mapped_file.h"
#include "chat/chat_template.h"

namespace dh::server {
namespace {

class TemplateRenderer : public ChatPromptRenderer {
 public:
  TemplateRenderer(chat::ChatTemplate tmpl, std::string source, std::string bos, std::string eos)
      : tmpl_(std::move(tmpl)), source_(std::move(source)), bos_(std::move(bos)), eos_(std::move(eos)) {
    ChatMessage probe;
    probe.role = "user";
    probe.content = "x";
    auto text = Render({probe}, nullptr, true, nullptr);
    if (text.ok()) {
      std::string_view t = *text;
      while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
      opens_think_ = t.size() >= 7 && t.substr(t.size() - 7) == "<think>";
    }
  }

  Result<std::string> Render(const std::vector<ChatMessage>& messages, const Json& tools,
                             bool add_generation_prompt, const Json& kwargs) const override {
    Json context = Json::object();
    if (kwargs.is_object()) context = kwargs;  // the fixed variables below win
    Json list = Json::array();
    for (const ChatMessage& m : messages) {
      Json msg = {{"role", m.role}, {"content", m.content ? Json(*m.content) : Json()}};
      if (m.name) msg["name"] = *m.name;
      if (m.tool_call_id) msg["tool_call_id"] = *m.tool_call_id;
      if (!m.tool_calls.is_null()) msg["tool_calls"] = m.tool_calls;
      list.push_back(std::move(msg));
    }
    context["messages"] = std::move(list);
    if (tools.is_array()) context["tools"] = tools;
    context["add_generation_prompt"] = add_generation_prompt;
    context["bos_token"] = bos_;
    context["eos_token"] = eos_;
    auto out = tmpl_.Render(context);
    if (!out.ok()) {
      // Templates that predate tool calling concatenate content and fail on the null content
      // of an assistant tool-call turn: render those turns with empty content instead.
      bool changed = false;
      for (Json& msg : context["messages"]) {
        if (msg["content"].is_null()) {
          msg["content"] = "";
          changed = true;
        }
      }
      if (changed) {
        auto retry = tmpl_.Render(context);
        if (retry.ok()) return retry;
      }
      return InvalidArgument("chat template: {}", out.status().message());
    }
    return out;
  }

  bool OpensThinkBlock() const override { return opens_think_; }
  std::string_view Source() const override { return source_; }

 private:
  chat::ChatTemplate tmpl_;
  std::string source_;
  std::string bos_, eos_;
  bool opens_think_ = false;
};

}  // namespace

Result<std::unique_ptr<ChatPromptRenderer>> MakeTemplateRenderer(const std::string& source,
                                                                 std::string bos_token,
                                                                 std::string eos_token) {
  DH_ASSIGN_OR_RETURN(chat::ChatTemplate tmpl, chat::ChatTemplate::Parse(source));
  return std::unique_ptr<ChatPromptRenderer>(
      new TemplateRenderer(std::move(tmpl), source, std::move(bos_token), std::move(eos_token)));
}

Result<std::unique_ptr<ChatPromptRenderer>> LoadChatRenderer(const std::string& model_dir,
                                                             const std::string& override_value) {
  chat::ChatTemplateConfig config;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    DH_ASSIGN_OR_RETURN(std::string text, ReadTextFile(config_path));
    Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return InvalidArgument("{}: not valid JSON", config_path);
    auto parsed = chat::ChatTemplateFromTokenizerConfig(json);
    if (!parsed.ok()) return parsed.status().WithContext(config_path);
    config = std::move(parsed).value();
  }
  std::string source = config.chat_template;
  if (!override_value.empty()) {
    if (std::filesystem::is_regular_file(override_value, ec)) {
      DH_ASSIGN_OR_RETURN(source, ReadTextFile(override_value));
    } else {
      source = override_value;
    }
  }
  if (source.empty()) return MakePlainChatRenderer();
  auto renderer = MakeTemplateRenderer(source, config.bos_token, config.eos_token);
  if (!renderer.ok()) return renderer.status().WithContext("chat template");
  return renderer;
}

}  // namespace dh::server
