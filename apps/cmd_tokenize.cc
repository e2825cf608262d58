// Text commands: `tokenize` (text -> ids, one shot or JSON lines on stdin) and `detokenize`
// (ids -> text). --model-path may be a folder holding only the tokenizer files.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/command.h"
#include "apps/model_options.h"
#include "tokenizer/tokenizer.h"

namespace dh::app {
namespace {

void PrintLine(const nlohmann::json& j) {
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// One JSON-lines request -> one response object ({"ids": [...]} or {"error": "..."}).
nlohmann::json TokenizeLine(const Tokenizer& tokenizer, const std::string& line,
                            bool add_special_tokens, bool* bad) {
  *bad = true;
  nlohmann::json request;
  try {
    request = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    return {{"error", std::string("invalid JSON: ") + e.what()}};
  }
  if (!request.is_object() || !request.contains("text") || !request.at("text").is_string()) {
    return {{"error", "expected an object with a string field \"text\""}};
  }
  auto ids = tokenizer.Encode(request.at("text").get_ref<const std::string&>(), add_special_tokens);
  if (!ids.ok()) return {{"error", ids.status().message()}};
  *bad = false;
  return {{"ids", *ids}};
}

std::function<int()> SetupTokenize(CLI::App* sub) {
  struct Args {
    std::string model_path, text;
    bool add_special_tokens = false;
    bool jsonl = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--model-path,--model", a->model_path, "Folder with tokenizer.json")->required();
  sub->add_flag("--add-special-tokens", a->add_special_tokens,
                "Apply the post-processor (e.g. BOS) as Hugging Face does");
  sub->add_flag("--jsonl", a->jsonl,
                "Read {\"text\": ...} lines on stdin, write {\"ids\": [...]} or {\"error\": ...} "
                "per line");
  sub->add_option("text", a->text, "Text to tokenize (without --jsonl)");
  return [a, sub]() -> int {
    auto tokenizer = Tokenizer::Load(a->model_path);
    if (!tokenizer.ok()) return ReportError(tokenizer.status());
    if (!a->jsonl) {
      if (sub->count("text") == 0) {
        return ReportError(
            InvalidArgument("tokenize: give the text as an argument or use --jsonl"));
      }
      auto ids = (*tokenizer)->Encode(a->text, a->add_special_tokens);
      if (!ids.ok()) return ReportError(ids.status());
      PrintLine({{"ids", *ids}});
      return kExitOk;
    }
    if (sub->count("text") != 0) {
      return ReportError(InvalidArgument("tokenize: --jsonl reads stdin; drop the text argument"));
    }
    bool any_bad = false;
    std::string line;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      bool bad = false;
      PrintLine(TokenizeLine(**tokenizer, line, a->add_special_tokens, &bad));
      any_bad = any_bad || bad;
    }
    return any_bad ? kExitBadInput : kExitOk;
  };
}

std::function<int()> SetupDetokenize(CLI::App* sub) {
  struct Args {
    std::string model_path, ids;
    bool skip_special_tokens = false;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("--model-path,--model", a->model_path, "Folder with tokenizer.json")->required();
  sub->add_option("--ids", a->ids, "Comma-separated token ids")->required();
  sub->add_flag("--skip-special-tokens", a->skip_special_tokens, "Leave special tokens out");
  sub->add_flag("--json", a->json, "Print {\"text\": ...} instead of the raw text");
  return [a]() -> int {
    std::vector<int32_t> ids;
    if (a->ids.find_first_not_of(' ') != std::string::npos) {
      auto parsed = ParseIdList(a->ids, "--ids");
      if (!parsed.ok()) return ReportError(parsed.status());
      ids = std::move(parsed).value();
    }
    auto tokenizer = Tokenizer::Load(a->model_path);
    if (!tokenizer.ok()) return ReportError(tokenizer.status());
    auto text = (*tokenizer)->Decode(ids, a->skip_special_tokens);
    if (!text.ok()) return ReportError(text.status());
    if (a->json) {
      PrintLine({{"text", *text}});
    } else {
      std::fwrite(text->data(), 1, text->size(), stdout);
      std::fputc('\n', stdout);
    }
    return kExitOk;
  };
}

DH_REGISTER_COMMAND(tokenize_command, "tokenize", "Text to token ids with the model's tokenizer",
                    SetupTokenize);
DH_REGISTER_COMMAND(detokenize_command, "detokenize", "Token ids to text", SetupDetokenize);

}  // namespace
}  // namespace dh::app
