// Tool-call request fields, forced-call schemas and the per-family output parsers.
#include "server/tool_calls.h"

#include <atomic>
#include <random>

#include <fmt/format.h>

namespace dh::server {
namespace {

constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kHermesBegin = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<Json> ParseJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Arguments as JSON text: an object is re-serialized compactly; a string holding JSON is kept.
std::optional<std::string> ArgumentsText(const Json& args) {
  if (args.is_object()) return SafeDump(args);
  if (args.is_string() && ParseJson(args.get<std::string>())) return args.get<std::string>();
  return std::nullopt;
}

ToolParseResult Plain(std::string_view text) { return {std::string(text), {}}; }

ToolParseResult ParseDeepSeek(std::string_view text) {
  const size_t begin = text.find(kDsCallsBegin);
  if (begin == std::string_view::npos) return Plain(text);
  ToolParseResult r;
  r.content = std::string(text.substr(0, begin));
  std::string_view rest = text.substr(begin + kDsCallsBegin.size());
  while (true) {
    rest = Trim(rest);
    if (rest.empty() || rest.substr(0, kDsCallsEnd.size()) == kDsCallsEnd) break;
    if (rest.substr(0, kDsCallBegin.size()) != kDsCallBegin) return Plain(text);
    rest.remove_prefix(kDsCallBegin.size());
    const size_t end = rest.find(kDsCallEnd);
    const size_t sep = rest.find(kDsSep);
    if (end == std::string_view::npos || sep == std::string_view::npos || sep > end) return Plain(text);
    std::string_view head = rest.substr(0, sep);
    std::string_view body = rest.substr(sep + kDsSep.size(), end - sep - kDsSep.size());
    rest.remove_prefix(end + kDsCallEnd.size());
    ToolCall call;
    const size_t fence = body.find("```json");
    if (fence != std::string_view::npos) {  // V3: type<sep>name\n```json\nargs\n```
      call.name = std::string(Trim(body.substr(0, fence)));
      std::string_view args = body.substr(fence + 7);
      const size_t close = args.rfind("```");
      if (close == std::string_view::npos) return Plain(text);
      args = Trim(args.substr(0, close));
      auto parsed = ParseJson(args);
      if (!parsed || !parsed->is_object()) return Plain(text);
      call.arguments = SafeDump(*parsed);
    } else {  // V3.1: name<sep>args
      call.name = std::string(Trim(head));
      auto parsed = ParseJson(Trim(body));
      if (!parsed || !parsed->is_object()) return Plain(text);
      call.arguments = SafeDump(*parsed);
    }
    if (call.name.empty()) return Plain(text);
    call.id = NewToolCallId();
    r.calls.push_back(std::move(call));
  }
  if (r.calls.empty()) return Plain(text);
  return r;
}

std::optional<ToolCall> CallFromObject(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall call;
  call.name = name->get<std::string>();
  if (args == j.end()) {
    call.arguments = "{}";
  } else {
    auto text = ArgumentsText(*args);
    if (!text) return std::nullopt;
    call.arguments = *text;
  }
  call.id = NewToolCallId();
  return call;
}

ToolParseResult ParseHermes(std::string_view text) {
  const size_t first = text.find(kHermesBegin);
  if (first == std::string_view::npos) return Plain(text);
  ToolParseResult r;
  r.content = std::string(Trim(text.substr(0, first)));
  std::string_view rest = text.substr(first);
  while (true) {
    rest = Trim(rest);
    if (rest.empty()) break;
    if (rest.substr(0, kHermesBegin.size()) != kHermesBegin) return Plain(text);
    rest.remove_prefix(kHermesBegin.size());
    size_t end = rest.find(kHermesEnd);
    std::string_view body = rest.substr(0, end);  // an unclosed last call is still read
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + kHermesEnd.size());
    auto parsed = ParseJson(Trim(body));
    if (!parsed) return Plain(text);
    auto call = CallFromObject(*parsed);
    if (!call) return Plain(text);
    r.calls.push_back(std::move(*call));
  }
  if (r.calls.empty()) return Plain(text);
  return r;
}

ToolParseResult ParseLlama3(std::string_view text) {
  std::string_view body = Trim(text);
  if (body.substr(0, kPythonTag.size()) == kPythonTag) body = Trim(body.substr(kPythonTag.size()));
  if (body.empty() || body.front() != '{') return Plain(text);
  ToolParseResult r;
  // Calls separated by ';' at the top level (outside strings and brackets).
  int depth = 0;
  bool in_string = false, escape = false;
  size_t start = 0;
  for (size_t i = 0; i <= body.size(); ++i) {
    const char c = i < body.size() ? body[i] : ';';
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') --depth;
    else if (c == ';' && depth == 0) {
      std::string_view piece = Trim(body.substr(start, i - start));
      start = i + 1;
      if (piece.empty()) continue;
      auto parsed = ParseJson(piece);
      if (!parsed) return Plain(text);
      auto call = CallFromObject(*parsed);
      if (!call) return Plain(text);
      r.calls.push_back(std::move(*call));
    }
  }
  if (r.calls.empty()) return Plain(text);
  return r;
}

}  // namespace

bool ParseToolParserName(std::string_view name, bool* is_auto, ToolParser* parser) {
  *is_auto = name == "auto";
  if (name == "auto" || name == "none") *parser = ToolParser::kNone;
  else if (name == "deepseek_v3" || name == "deepseek_v31") *parser = ToolParser::kDeepSeekV3;
  else if (name == "hermes") *parser = ToolParser::kHermes;
  else if (name == "llama3_json") *parser = ToolParser::kLlama3Json;
  else return false;
  return true;
}

ToolParser DetectToolParser(std::string_view tmpl) {
  if (tmpl.find("tool▁call▁begin") != std::string_view::npos) return ToolParser::kDeepSeekV3;
  if (tmpl.find("<tool_call>") != std::string_view::npos) return ToolParser::kHermes;
  if (tmpl.find("<|python_tag|>") != std::string_view::npos || tmpl.find("ipython") != std::string_view::npos)
    return ToolParser::kLlama3Json;
  return ToolParser::kNone;
}

const char* ToolParserName(ToolParser parser) {
  switch (parser) {
    case ToolParser::kDeepSeekV3: return "deepseek_v3";
    case ToolParser::kHermes: return "hermes";
    case ToolParser::kLlama3Json: return "llama3_json";
    case ToolParser::kNone: break;
  }
  return "none";
}

std::string_view ToolCallMarker(ToolParser parser) {
  switch (parser) {
    case ToolParser::kDeepSeekV3: return kDsCallsBegin;
    case ToolParser::kHermes: return kHermesBegin;
    case ToolParser::kLlama3Json: return kPythonTag;
    case ToolParser::kNone: break;
  }
  return {};
}

ToolParseResult ParseToolCalls(ToolParser parser, std::string_view text,
                               const std::vector<std::string>& trailing) {
  for (bool again = true; again;) {
    again = false;
    for (const std::string& t : trailing) {
      if (!t.empty() && text.size() >= t.size() && text.substr(text.size() - t.size()) == t) {
        text.remove_suffix(t.size());
        again = true;
      }
    }
  }
  switch (parser) {
    case ToolParser::kDeepSeekV3: return ParseDeepSeek(text);
    case ToolParser::kHermes: return ParseHermes(text);
    case ToolParser::kLlama3Json: return ParseLlama3(text);
    case ToolParser::kNone: break;
  }
  return Plain(text);
}

std::string NewToolCallId() {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  return fmt::format("call_{:012x}{:012x}", salt & 0xFFFFFFFFFFFF, counter.fetch_add(1));
}

Json ToolCallsJson(const std::vector<ToolCall>& calls) {
  Json out = Json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

std::variant<ToolRequest, ApiError> ParseToolRequest(const Json& body) {
  ToolRequest r;
  auto tools = body.find("tools");
  const bool has_tools = tools != body.end() && !tools->is_null();
  if (has_tools) {
    if (!tools->is_array()) return BadRequest("tools", "'tools' must be an array");
    if (tools->size() > 128) return BadRequest("tools", "at most 128 tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string p = fmt::format("tools[{}]", i);
      if (!t.is_object() || t.value("type", "function") != "function")
        return BadRequest(p, fmt::format("'{}' must be {{\"type\": \"function\", \"function\": {{...}}}}", p));
      auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        return BadRequest(p + ".function.name", fmt::format("'{}.function.name' is required", p));
      if (fn->contains("parameters") && !(*fn)["parameters"].is_object())
        return BadRequest(p + ".function.parameters", "'parameters' must be a JSON Schema object");
    }
    r.tools = *tools;
    r.choice = ToolRequest::Choice::kAuto;
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return BadRequest("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    r.parallel = it->get<bool>();
  }
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "none") r.choice = ToolRequest::Choice::kNone;
      else if (c == "auto") r.choice = has_tools ? ToolRequest::Choice::kAuto : ToolRequest::Choice::kNone;
      else if (c == "required") r.choice = ToolRequest::Choice::kRequired;
      else return BadRequest("tool_choice", "tool_choice must be 'none', 'auto', 'required' or a function");
    } else if (it->is_object()) {
      const Json* fn = it->contains("function") ? &(*it)["function"] : nullptr;
      if (!fn || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        return BadRequest("tool_choice.function.name", "a named tool_choice needs function.name");
      r.choice = ToolRequest::Choice::kNamed;
      r.named = (*fn)["name"].get<std::string>();
    } else {
      return BadRequest("tool_choice", "tool_choice must be a string or an object");
    }
    if ((r.choice == ToolRequest::Choice::kRequired || r.choice == ToolRequest::Choice::kNamed) && !has_tools)
      return BadRequest("tool_choice", "tool_choice 'required' or a named function needs 'tools'");
  }
  auto params_of = [](const Json& t) {
    const Json& fn = t["function"];
    return fn.contains("parameters") ? fn["parameters"] : Json{{"type", "object"}};
  };
  if (r.choice == ToolRequest::Choice::kNamed) {
    bool found = false;
    for (const Json& t : r.tools) {
      if (t["function"]["name"] == r.named) {
        r.forced_schema = params_of(t);
        found = true;
      }
    }
    if (!found) return BadRequest("tool_choice", fmt::format("no tool named '{}' in 'tools'", r.named));
  } else if (r.choice == ToolRequest::Choice::kRequired) {
    Json any_of = Json::array();
    Json defs = Json::object();
    for (const Json& t : r.tools) {
      Json params = params_of(t);
      // Each tool's $defs are lifted so its local $refs still resolve from the combined root.
      if (params.contains("$defs") || params.contains("definitions"))
        return BadRequest("tools", "tool_choice 'required' with $defs in parameters is not supported; "
                                   "name the function instead");
      any_of.push_back({{"type", "object"},
                        {"properties", {{"name", {{"const", t["function"]["name"]}}}, {"parameters", params}}},
                        {"required", {"name", "parameters"}}});
    }
    r.forced_schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", any_of}}}};
    if (!r.parallel) r.forced_schema["maxItems"] = 1;
  }
  return r;
}

std::vector<ToolCall> ForcedCallsFromOutput(const ToolRequest& request, std::string_view text) {
  std::vector<ToolCall> calls;
  auto parsed = ParseJson(text);
  if (!parsed) return calls;
  if (request.choice == ToolRequest::Choice::kNamed) {
    if (!parsed->is_object()) return calls;
    calls.push_back({NewToolCallId(), request.named, SafeDump(*parsed)});
  } else if (request.choice == ToolRequest::Choice::kRequired && parsed->is_array()) {
    for (const Json& item : *parsed) {
      if (!item.is_object() || !item.contains("name") || !item.contains("parameters")) continue;
      calls.push_back({NewToolCallId(), item["name"].get<std::string>(), SafeDump(item["parameters"])});
    }
  }
  return calls;
}

namespace {

// `{"name": "<string>", "parameters":` with the compact layout's optional spaces: the name when
// `head` is exactly that, else nullopt.
std::optional<std::string> NameFromHead(std::string_view head) {
  auto skip_space = [&](size_t* i) {
    while (*i < head.size() && head[*i] == ' ') ++*i;
  };
  auto expect = [&](size_t* i, std::string_view lit) {
    skip_space(i);
    if (head.substr(*i, lit.size()) != lit) return false;
    *i += lit.size();
    return true;
  };
  size_t i = 0;
  if (!expect(&i, "{") || !expect(&i, "\"name\"") || !expect(&i, ":")) return std::nullopt;
  skip_space(&i);
  const size_t start = i;
  if (i >= head.size() || head[i] != '"') return std::nullopt;
  for (++i; i < head.size() && head[i] != '"'; ++i) {
    if (head[i] == '\\') ++i;
  }
  if (i >= head.size()) return std::nullopt;
  const std::string_view literal = head.substr(start, i + 1 - start);
  ++i;
  if (!expect(&i, ",") || !expect(&i, "\"parameters\"") || !expect(&i, ":")) return std::nullopt;
  skip_space(&i);
  if (i != head.size()) return std::nullopt;
  auto name = ParseJson(literal);
  if (!name || !name->is_string()) return std::nullopt;
  return name->get<std::string>();
}

}  // namespace

void ForcedCallStreamer::Push(std::string_view text, std::vector<Event>* out) {
  for (char c : text) OnByte(c, out);
}

void ForcedCallStreamer::OnByte(char c, std::vector<Event>* out) {
  // The parameters value ends at a ',' or '}' of the call object itself.
  if (in_args_ && !in_string_ && depth_ == args_depth_ && (c == ',' || c == '}')) in_args_ = false;
  if (in_args_ && !(c == ' ' && !args_started_)) {
    args_started_ = true;
    if (out->empty() || out->back().index != index_) out->push_back({index_, "", "", ""});
    out->back().arguments.push_back(c);
  }
  if (in_string_) {
    if (escaped_) escaped_ = false;
    else if (c == '\\') escaped_ = true;
    else if (c == '"') in_string_ = false;
  } else if (c == '"') {
    in_string_ = true;
  } else if (c == '{' || c == '[') {
    if (++depth_ == 2 && c == '{') {
      head_.clear();
      collecting_ = true;
    }
  } else if (c == '}' || c == ']') {
    --depth_;
  }
  if (!collecting_) return;
  head_.push_back(c);
  if (head_.size() > 4096) {
    collecting_ = false;  // not the shape forced_schema writes: the end-of-output parse decides
    return;
  }
  if (c != ':' || in_string_) return;
  if (std::optional<std::string> name = NameFromHead(head_)) {
    index_ = headers_++;
    out->push_back({index_, NewToolCallId(), std::move(*name), ""});
    collecting_ = false;
    in_args_ = true;
    args_started_ = false;
    args_depth_ = depth_;
  }
}

std::string ToolCallStreamer::Push(std::string_view text) {
  held_ += text;
  if (in_call_) return {};
  const std::string_view marker = ToolCallMarker(parser_);
  if (parser_ == ToolParser::kLlama3Json) {
    // Llama's JSON calls may also start bare with '{' at the very beginning of the output.
    const std::string_view t = Trim(held_);
    if (!sent_any_ && !t.empty() && t.front() == '{') {
      in_call_ = true;
      return {};
    }
  }
  if (!marker.empty()) {
    const size_t at = held_.find(marker);
    if (at != std::string::npos) {
      in_call_ = true;
      std::string out = held_.substr(0, at);
      held_.erase(0, at);
      if (!out.empty()) sent_any_ = true;
      return out;
    }
  }
  // Hold back a suffix that could still become the marker or a trailing end-of-turn text.
  size_t keep = 0;
  auto consider = [&](std::string_view s) {
    for (size_t k = std::min(s.size(), held_.size()); k > keep; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == s.substr(0, k)) {
        keep = k;
        break;
      }
    }
  };
  if (!marker.empty()) consider(marker);
  for (const std::string& t : trailing_) consider(t);
  if (parser_ == ToolParser::kLlama3Json && !sent_any_ && Trim(held_).empty()) keep = held_.size();
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  if (!out.empty()) sent_any_ = true;
  return out;
}

ToolParseResult ToolCallStreamer::Finish() {
  ToolParseResult r = ParseToolCalls(parser_, held_, trailing_);
  held_.clear();
  return r;
}

}  // namespace dh::server
