// `deepharness chat-template`: renders conversations read as JSON lines on stdin with a model's
// chat template, one {"rendered": ...} or {"error": ...} line each. Exit 2 if a line is malformed.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "apps/command.h"
#include "apps/model_options.h"
#include "chat/chat_template.h"

namespace dh::app {
namespace {

using ojson = nlohmann::ordered_json;

void PrintLine(const ojson& j) {
  const std::string line = j.dump(-1, ' ', false, ojson::error_handler_t::replace);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

Result<std::string> ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return IoError("cannot open {}", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TemplateSetup {
  chat::ChatTemplate tmpl;
  std::string bos_token, eos_token;
};

// The template of --chat-template FILE if given, else tokenizer_config.json's; special tokens
// come from tokenizer_config.json when it exists.
Result<TemplateSetup> LoadTemplate(const std::string& model_path, const std::string& template_file,
                                   const std::string& template_name) {
  std::filesystem::path config_path = std::filesystem::path(model_path) / "tokenizer_config.json";
  chat::ChatTemplateConfig config;
  bool have_config = std::filesystem::exists(config_path);
  if (!have_config && template_file.empty()) {
    return NotFound("{} not found (or pass --chat-template FILE)", config_path.string());
  }
  if (have_config) {
    DH_ASSIGN_OR_RETURN(std::string text, ReadText(config_path));
    ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) return InvalidArgument("{}: not valid JSON", config_path.string());
    auto c = chat::ChatTemplateFromTokenizerConfig(parsed, template_name);
    if (c.ok()) {
      config = std::move(c).value();
    } else if (template_file.empty() || c.status().code() != StatusCode::kNotFound) {
      return c.status().WithContext(config_path.string());
    }
  }
  if (!template_file.empty()) {
    DH_ASSIGN_OR_RETURN(config.chat_template, ReadText(template_file));
  }
  auto tmpl = chat::ChatTemplate::Parse(config.chat_template);
  if (!tmpl.ok()) {
    return tmpl.status().WithContext(template_file.empty() ? config_path.string() : template_file);
  }
  return TemplateSetup{std::move(tmpl).value(), config.bos_token, config.eos_token};
}

// One request line -> one response object. Unknown keys pass through as template variables
// (e.g. "enable_thinking"); tools and add_generation_prompt default as in transformers.
ojson RenderLine(const TemplateSetup& setup, const std::string& line, bool* bad) {
  *bad = true;
  ojson request = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) return {{"error", "invalid JSON line"}};
  if (!request.is_object() || !request.contains("messages") || !request["messages"].is_array()) {
    return {{"error", "expected an object with an array field \"messages\""}};
  }
  *bad = false;
  ojson context = request;
  if (!context.contains("tools")) context["tools"] = nullptr;
  if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = false;
  if (!context.contains("bos_token")) context["bos_token"] = setup.bos_token;
  if (!context.contains("eos_token")) context["eos_token"] = setup.eos_token;
  auto rendered = setup.tmpl.Render(context);
  if (!rendered.ok()) return {{"error", rendered.status().message()}};
  return {{"rendered", *rendered}};
}

std::function<int()> SetupChatTemplate(CLI::App* sub) {
  struct Args {
    std::string model_path, template_file, template_name = "default";
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--model-path,--model", a->model_path, "Folder with tokenizer_config.json")->required();
  sub->add_option("--chat-template", a->template_file,
                  "Jinja file to use instead of tokenizer_config.json's chat_template");
  sub->add_option("--template-name", a->template_name,
                  "Which named template when chat_template is a list (default: \"default\")");
  return [a]() -> int {
    auto setup = LoadTemplate(a->model_path, a->template_file, a->template_name);
    if (!setup.ok()) return ReportError(setup.status());
    bool any_bad = false;
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      bool bad = false;
      PrintLine(RenderLine(*setup, line, &bad));
      any_bad = any_bad || bad;
    }
    return any_bad ? kExitBadInput : kExitOk;
  };
}

DH_REGISTER_COMMAND(kChatTemplateCommand, "chat-template",
                    "Render conversations (JSON lines on stdin) with the model's chat template",
                    SetupChatTemplate);

}  // namespace
}  // namespace dh::app
