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

namespace {

// ---- Incremental reading of calls (auto mode streaming) ----

// A JSON value read from s[p]: complete (ending before `end`), a valid prefix running to the end
// of s, or invalid. `members` records the top-level object's members (key, value start, value
// end or npos while incomplete). Only objects, arrays and strings are read as top-level values,
// so completion never depends on what follows.
struct JsonScan {
  enum State { kComplete, kPartial, kInvalid } state = kPartial;
  size_t end = 0;
  struct Member {
    std::string_view key;
    size_t begin = 0, end = std::string_view::npos;
  };
  std::vector<Member> members;
};

bool IsJsonSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A string from the '"' at s[i]: kComplete with *end after the closing quote, kPartial, kInvalid.
JsonScan::State ScanString(std::string_view s, size_t i, size_t* end) {
  for (++i; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') {
      *end = i + 1;
      return JsonScan::kComplete;
    }
    if (c < 0x20) return JsonScan::kInvalid;
    if (c != '\\') continue;
    if (++i >= s.size()) return JsonScan::kPartial;
    const char e = s[i];
    if (e == 'u') {
      for (int k = 0; k < 4; ++k) {
        if (++i >= s.size()) return JsonScan::kPartial;
        if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return JsonScan::kInvalid;
      }
    } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
      return JsonScan::kInvalid;
    }
  }
  return JsonScan::kPartial;
}

// A number from s[i] (JSON's grammar); kComplete with *end at the first byte after it.
JsonScan::State ScanNumber(std::string_view s, size_t i, size_t* end) {
  // 0 sign, 1 int first digit, 2 int digits, 3 after '0', 4 frac first, 5 frac, 6 exp sign,
  // 7 exp first, 8 exp digits.
  int st = 0;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    const bool digit = c >= '0' && c <= '9';
    const int before = st;
    if (st == 0 && c == '-') st = 1;
    else if ((st == 0 || st == 1) && c == '0') st = 3;
    else if ((st == 0 || st == 1) && digit) st = 2;
    else if (st == 2 && digit) st = 2;
    else if ((st == 2 || st == 3) && c == '.') st = 4;
    else if ((st == 4 || st == 5) && digit) st = 5;
    else if ((st == 2 || st == 3 || st == 5) && (c == 'e' || c == 'E')) st = 6;
    else if (st == 6 && (c == '+' || c == '-')) st = 7;
    else if ((st == 6 || st == 7 || st == 8) && digit) st = 8;
    if (st != before || (digit && (st == 2 || st == 5 || st == 8))) continue;
    if (st == 2 || st == 3 || st == 5 || st == 8) {
      *end = i;
      return JsonScan::kComplete;
    }
    return JsonScan::kInvalid;
  }
  return JsonScan::kPartial;
}

JsonScan ScanJsonValue(std::string_view s, size_t p) {
  JsonScan r;
  std::string stack;  // '{' / '['
  enum Mode { kValue, kValueOrClose, kKeyOrClose, kKey, kColon, kAfter } mode = kValue;
  size_t i = p;
  auto invalid = [&] {
    r.state = JsonScan::kInvalid;
    r.end = i;
    return r;
  };
  while (i < s.size()) {
    const char c = s[i];
    if (IsJsonSpace(c) && !stack.empty()) {
      ++i;
      continue;
    }
    bool value_done = false;
    switch (mode) {
      case kValue:
      case kValueOrClose: {
        if (mode == kValueOrClose && c == ']') {
          stack.pop_back();
          ++i;
          value_done = true;
          break;
        }
        if (stack.empty() && c != '{' && c != '[' && c != '"') return invalid();
        if (stack.size() == 1 && stack[0] == '{' && !r.members.empty()) r.members.back().begin = i;
        if (c == '{' || c == '[') {
          stack.push_back(c);
          mode = c == '{' ? kKeyOrClose : kValueOrClose;
          ++i;
          break;
        }
        size_t end = 0;
        JsonScan::State st;
        if (c == '"') {
          st = ScanString(s, i, &end);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
          st = ScanNumber(s, i, &end);
        } else {
          const std::string_view lit = c == 't' ? "true" : c == 'f' ? "false" : c == 'n' ? "null" : "";
          if (lit.empty()) return invalid();
          const std::string_view have = s.substr(i, lit.size());
          if (have != lit.substr(0, have.size())) return invalid();
          st = have.size() == lit.size() ? JsonScan::kComplete : JsonScan::kPartial;
          end = i + have.size();
        }
        if (st == JsonScan::kInvalid) return invalid();
        if (st == JsonScan::kPartial) return r;
        i = end;
        value_done = true;
        break;
      }
      case kKeyOrClose:
      case kKey: {
        if (mode == kKeyOrClose && c == '}') {
          stack.pop_back();
          ++i;
          value_done = true;
          break;
        }
        if (c != '"') return invalid();
        size_t end = 0;
        const JsonScan::State st = ScanString(s, i, &end);
        if (st == JsonScan::kInvalid) return invalid();
        if (st == JsonScan::kPartial) return r;
        if (stack.size() == 1) r.members.push_back({s.substr(i + 1, end - i - 2), 0, std::string_view::npos});
        i = end;
        mode = kColon;
        break;
      }
      case kColon:
        if (c != ':') return invalid();
        ++i;
        mode = kValue;
        break;
      case kAfter:
        if (c == ',') {
          mode = stack.back() == '{' ? kKey : kValue;
        } else if (c == (stack.back() == '{' ? '}' : ']')) {
          stack.pop_back();
          value_done = true;
        } else {
          return invalid();
        }
        ++i;
        break;
    }
    if (!value_done) continue;
    if (stack.empty()) {
      r.state = JsonScan::kComplete;
      r.end = i;
      return r;
    }
    if (stack.size() == 1 && stack[0] == '{' && !r.members.empty() &&
        r.members.back().end == std::string_view::npos && r.members.back().begin > 0)
      r.members.back().end = i;
    mode = kAfter;
  }
  return r;
}

// What the text from a family's call marker on holds so far.
struct CallsScan {
  struct Call {
    std::string name;          // empty while unknown
    size_t args_begin = 0;     // the arguments value in the region
    size_t args_end = 0;       // end of its valid text so far
    bool streamable = false;   // an object (sent in fragments)
    bool complete = false;     // the call and its closing marker are complete
    std::string args_text;     // complete, not streamable: the arguments to send
  };
  std::vector<Call> calls;
  bool malformed = false;
  size_t resume = 0;  // end of the last complete call: where content resumes after a malformed tail
};

bool StartsWith(std::string_view s, size_t at, std::string_view lit) { return s.substr(at, lit.size()) == lit; }
// s[at..] is a proper prefix of `lit` (more text could still complete it).
bool PrefixOf(std::string_view s, size_t at, std::string_view lit) {
  const std::string_view rest = s.substr(at);
  return rest.size() < lit.size() && lit.substr(0, rest.size()) == rest;
}
size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

// Reads a {"name": ..., "arguments"/"parameters": ...} object at s[p] into *call. Returns the
// scan state; a complete object that is not a call is kInvalid.
JsonScan::State ReadCallObject(std::string_view s, size_t p, CallsScan::Call* call, size_t* end) {
  JsonScan j = ScanJsonValue(s, p);
  if (j.state == JsonScan::kInvalid) return JsonScan::kInvalid;
  if (s[p] != '{') return JsonScan::kInvalid;
  bool have_args = false;
  for (const JsonScan::Member& m : j.members) {
    if (m.key == "name" && m.end != std::string_view::npos && call->name.empty()) {
      auto name = ParseJson(s.substr(m.begin, m.end - m.begin));
      if (!name || !name->is_string() || name->get<std::string>().empty()) return JsonScan::kInvalid;
      call->name = name->get<std::string>();
    }
    if ((m.key == "arguments" || m.key == "parameters") && m.begin > 0 && !have_args) {
      have_args = true;
      call->args_begin = m.begin;
      call->streamable = s[m.begin] == '{';
      call->args_end = m.end != std::string_view::npos ? m.end : s.size();
    }
  }
  if (j.state == JsonScan::kPartial) return JsonScan::kPartial;
  *end = j.end;
  if (call->name.empty()) return JsonScan::kInvalid;
  if (call->args_end == 0) {
    call->args_text = "{}";
  } else if (!call->streamable) {
    auto args = ParseJson(s.substr(call->args_begin, call->args_end - call->args_begin));
    std::optional<std::string> text = args ? ArgumentsText(*args) : std::nullopt;
    if (!text) return JsonScan::kInvalid;
    call->args_text = *text;
  }
  return JsonScan::kComplete;
}

CallsScan ScanHermesOrLlama(std::string_view s, bool hermes) {
  CallsScan r;
  size_t i = 0;
  bool first = true;
  while (true) {
    i = SkipSpace(s, i);
    if (i >= s.size()) return r;
    if (hermes) {
      if (PrefixOf(s, i, kHermesBegin)) return r;
      if (!StartsWith(s, i, kHermesBegin)) break;
      i = SkipSpace(s, i + kHermesBegin.size());
    } else {
      if (!first) {
        if (s[i] != ';') break;
        i = SkipSpace(s, i + 1);
      } else if (StartsWith(s, i, kPythonTag)) {
        i = SkipSpace(s, i + kPythonTag.size());
      } else if (PrefixOf(s, i, kPythonTag)) {
        return r;
      }
    }
    first = false;
    if (i >= s.size()) return r;
    CallsScan::Call call;
    size_t end = 0;
    const JsonScan::State st = ReadCallObject(s, i, &call, &end);
    if (st == JsonScan::kInvalid) break;
    r.calls.push_back(std::move(call));
    if (st == JsonScan::kPartial) return r;
    i = end;
    r.calls.back().complete = true;  // (hermes: an unclosed last call is still read)
    r.resume = i;
    if (hermes) {
      const size_t close = SkipSpace(s, i);
      if (PrefixOf(s, close, kHermesEnd) || close >= s.size()) return r;
      if (!StartsWith(s, close, kHermesEnd)) break;
      i = close + kHermesEnd.size();
      r.resume = i;
    }
  }
  r.malformed = true;
  return r;
}

CallsScan ScanDeepSeek(std::string_view s) {
  CallsScan r;
  size_t i = kDsCallsBegin.size();
  if (!StartsWith(s, 0, kDsCallsBegin)) return r;
  while (true) {
    i = SkipSpace(s, i);
    if (i >= s.size() || PrefixOf(s, i, kDsCallsEnd) || PrefixOf(s, i, kDsCallBegin)) return r;
    if (StartsWith(s, i, kDsCallsEnd)) {
      r.resume = s.size();  // what follows the calls is dropped, as in the whole-output parse
      return r;
    }
    if (!StartsWith(s, i, kDsCallBegin)) break;
    i += kDsCallBegin.size();
    const size_t sep = s.find(kDsSep, i);
    if (sep == std::string_view::npos) {
      if (s.find(kDsCallEnd, i) != std::string_view::npos || s.size() - i > 512) break;
      return r;
    }
    CallsScan::Call call;
    const size_t body = sep + kDsSep.size();
    size_t args = SkipSpace(s, body);
    if (args >= s.size()) return r;
    const bool v31 = s[args] == '{';
    if (v31) {
      call.name = std::string(Trim(s.substr(i, sep - i)));
    } else {
      const size_t fence = s.find("```json", body);
      if (fence == std::string_view::npos) {
        if (s.find(kDsCallEnd, body) != std::string_view::npos || s.size() - body > 512) break;
        return r;
      }
      call.name = std::string(Trim(s.substr(body, fence - body)));
      args = SkipSpace(s, fence + 7);
      if (args >= s.size()) return r;
      if (s[args] != '{') break;
    }
    if (call.name.empty()) break;
    JsonScan j = ScanJsonValue(s, args);
    call.args_begin = args;
    call.streamable = true;
    call.args_end = j.state == JsonScan::kPartial ? s.size() : j.end;  // invalid: the valid prefix
    r.calls.push_back(std::move(call));
    if (j.state == JsonScan::kInvalid) break;
    if (j.state == JsonScan::kPartial) return r;
    i = SkipSpace(s, j.end);
    if (!v31) {
      if (PrefixOf(s, i, "```")) return r;
      if (!StartsWith(s, i, "```")) break;
      i = SkipSpace(s, i + 3);
    }
    if (i >= s.size() || PrefixOf(s, i, kDsCallEnd)) return r;
    if (!StartsWith(s, i, kDsCallEnd)) break;
    i += kDsCallEnd.size();
    r.calls.back().complete = true;
    r.resume = i;
  }
  r.malformed = true;
  return r;
}

CallsScan ScanCalls(ToolParser parser, std::string_view region) {
  switch (parser) {
    case ToolParser::kDeepSeekV3: return ScanDeepSeek(region);
    case ToolParser::kHermes: return ScanHermesOrLlama(region, true);
    case ToolParser::kLlama3Json: return ScanHermesOrLlama(region, false);
    case ToolParser::kNone: break;
  }
  CallsScan r;
  r.malformed = true;
  return r;
}

std::string_view StripTrailing(std::string_view text, const std::vector<std::string>& trailing) {
  for (bool again = true; again;) {
    again = false;
    for (const std::string& t : trailing) {
      if (!t.empty() && text.size() >= t.size() && text.substr(text.size() - t.size()) == t) {
        text.remove_suffix(t.size());
        again = true;
      }
    }
  }
  return text;
}

}  // namespace

std::string ToolCallStreamer::ReleaseText(bool final) {
  if (final) {
    std::string out(StripTrailing(held_, trailing_));
    held_.clear();
    if (!out.empty()) sent_any_ = true;
    return out;
  }
  // Hold back a suffix that could still become the marker or a trailing end-of-turn text.
  const std::string_view marker = mode_ == Mode::kText ? ToolCallMarker(parser_) : std::string_view();
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
  if (mode_ == Mode::kText && parser_ == ToolParser::kLlama3Json && !sent_any_ && Trim(held_).empty())
    keep = held_.size();
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  if (!out.empty()) sent_any_ = true;
  return out;
}

std::string ToolCallStreamer::Push(std::string_view text, std::vector<Event>* events) {
  if (mode_ == Mode::kCalls) {
    region_ += text;
    return Advance(false, events);
  }
  held_ += text;
  if (mode_ == Mode::kPlain) return ReleaseText(false);
  const std::string_view marker = ToolCallMarker(parser_);
  size_t at = std::string::npos;
  if (parser_ == ToolParser::kLlama3Json && !sent_any_) {
    // Llama's JSON calls may also start bare with '{' at the very beginning of the output.
    const size_t first = SkipSpace(held_, 0);
    if (first < held_.size() && held_[first] == '{') at = first;
  }
  if (at == std::string::npos && !marker.empty()) at = held_.find(marker);
  if (at == std::string::npos) return ReleaseText(false);
  // (a bare llama call: the spaces before it are not content)
  std::string out = held_[at] == '{' ? std::string() : held_.substr(0, at);
  if (!out.empty()) sent_any_ = true;
  region_ = held_.substr(at);
  held_.clear();
  mode_ = Mode::kCalls;
  return out + Advance(false, events);
}

std::string ToolCallStreamer::Advance(bool final, std::vector<Event>* events) {
  std::string_view region = region_;
  if (final) region = StripTrailing(region, trailing_);
  const CallsScan scan = ScanCalls(parser_, region);
  // A call the final text leaves unfinished is a malformed tail, unless its header was sent.
  const bool broken =
      scan.malformed ||
      (final && (scan.calls.empty() || (!scan.calls.back().complete && scan.calls.size() > sent_.size())));
  for (size_t i = 0; i < scan.calls.size(); ++i) {
    const CallsScan::Call& call = scan.calls[i];
    if (i >= sent_.size()) {
      if (broken && !call.complete) break;
      if (call.name.empty() || (!call.streamable && !call.complete) ||
          (call.streamable && call.args_end == 0))
        break;
      events->push_back({static_cast<int>(i), NewToolCallId(), call.name, ""});
      sent_.push_back(0);
      sent_end_.push_back(call.args_begin);
    }
    std::string_view fragment;
    if (call.streamable) {
      fragment = region.substr(call.args_begin + sent_[i], call.args_end - call.args_begin - sent_[i]);
    } else if (call.complete && sent_[i] == 0) {
      fragment = call.args_text;
    }
    if (fragment.empty()) continue;
    if (events->empty() || events->back().index != static_cast<int>(i))
      events->push_back({static_cast<int>(i), "", "", ""});
    events->back().arguments.append(fragment);
    sent_[i] += fragment.size();
    if (call.streamable) sent_end_[i] = call.args_begin + sent_[i];
  }
  if (!broken) {
    if (final) {  // what follows the calls (spaces, a cut marker) is dropped
      region_.clear();
      mode_ = Mode::kPlain;
    }
    return {};
  }
  // The rest of the text is content: all of it when no call was sent, else what follows the
  // last complete call (or the unsent tail of a call cut short).
  size_t from = 0;
  if (!sent_.empty()) {
    const size_t last = sent_.size() - 1;
    const bool complete = last < scan.calls.size() && scan.calls[last].complete;
    from = complete ? scan.resume : sent_end_.back();
  }
  held_ = std::string(region.substr(std::min(from, region.size())));
  region_.clear();
  mode_ = Mode::kPlain;
  return ReleaseText(final);
}

std::string ToolCallStreamer::Finish(std::vector<Event>* events) {
  if (mode_ == Mode::kCalls) return Advance(true, events);
  return ReleaseText(true);
}

}  // namespace dh::server
