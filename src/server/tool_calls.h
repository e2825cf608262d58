// Tool calling: the request's tools/tool_choice, the grammar that forces a call (tool_choice
// "required" or a named function), and the parsers that turn each model family's output into
// OpenAI tool_calls:
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
//                <｜tool▁call▁end｜>…<｜tool▁calls▁end｜> (and V3.1's NAME<｜tool▁sep｜>ARGS form)
//   hermes       <tool_call>{"name": …, "arguments": {…}}</tool_call> (Qwen)
//   llama3_json  [<|python_tag|>]{"name": …, "parameters": {…}} (several joined by ';')
// Malformed output never fails a request: it falls back to plain content.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "server/api_error.h"
#include "server/json_util.h"

namespace dh::server {

enum class ToolParser { kNone, kDeepSeekV3, kHermes, kLlama3Json };
// "auto" | "deepseek_v3" | "hermes" | "llama3_json" | "none"; false when unknown.
bool ParseToolParserName(std::string_view name, bool* is_auto, ToolParser* parser);
// The parser a chat template was written for (auto): looks for the family's call markers.
ToolParser DetectToolParser(std::string_view chat_template);
const char* ToolParserName(ToolParser parser);

struct ToolCall {
  std::string id;  // call_…
  std::string name;
  std::string arguments;  // JSON text
};

struct ToolParseResult {
  std::string content;  // text outside the calls
  std::vector<ToolCall> calls;
};

// Parses a complete output. `trailing` are strings removed from the end first (EOS texts, when
// special tokens were kept for the parser).
ToolParseResult ParseToolCalls(ToolParser parser, std::string_view text,
                               const std::vector<std::string>& trailing = {});

// The start marker of a family's calls ("" for none): streamed text is held back from the first
// possible marker on.
std::string_view ToolCallMarker(ToolParser parser);

// tools + tool_choice + parallel_tool_calls of a chat request.
struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  Choice choice = Choice::kNone;
  std::string named;  // kNamed: the function
  bool parallel = true;
  Json tools;         // the validated array (rendered by the template)
  // kRequired/kNamed: the JSON Schema the output is constrained to (see ForcedCallsFromOutput).
  Json forced_schema;
};
std::variant<ToolRequest, ApiError> ParseToolRequest(const Json& body);

// The calls in an output constrained by forced_schema (named: the arguments object; required:
// an array of {"name", "parameters"}). Empty when the output is not complete JSON (length).
std::vector<ToolCall> ForcedCallsFromOutput(const ToolRequest& request, std::string_view text);

std::string NewToolCallId();
// OpenAI's message.tool_calls array.
Json ToolCallsJson(const std::vector<ToolCall>& calls);

// Streams the output of tool_choice "required" (a JSON array of {"name": ..., "parameters": ...}
// written under forced_schema, so "name" comes first) as OpenAI tool-call deltas: a header with
// id and name once a call's name is complete, then its parameters' text in fragments as it
// arrives. The concatenated fragments are the call's arguments exactly as generated.
class ForcedCallStreamer {
 public:
  struct Event {
    int index = 0;
    std::string id;         // set on a call's first event (with name)
    std::string name;
    std::string arguments;  // the next fragment (may be empty on the header)
  };
  // Appends the events the text completes to *out.
  void Push(std::string_view text, std::vector<Event>* out);
  // Calls whose header was sent.
  int calls_started() const { return headers_; }

 private:
  void OnByte(char c, std::vector<Event>* out);

  int depth_ = 0;          // JSON nesting outside strings: 1 inside the array, 2 in a call object
  bool in_string_ = false;
  bool escaped_ = false;
  int index_ = -1;         // the call whose parameters are being written
  int headers_ = 0;        // calls started
  std::string head_;         // a call object's text up to its parameters value
  bool collecting_ = false;  // head_ is being filled
  bool in_args_ = false;     // inside the parameters value
  bool args_started_ = false;
  int args_depth_ = 0;       // depth_ where the parameters value started
};

// Streams the output of tool_choice "auto": text before a call is content, sent at once except
// a suffix that could still become the family's call marker or an end-of-turn text; from the
// marker on, the calls are read as they grow (DeepSeek-V3/V3.1 special tokens, hermes
// <tool_call> JSON, llama3 JSON) and sent as OpenAI tool-call deltas: a header (index, id, name)
// once a call's name is known and its arguments object has begun, then the arguments' text in
// fragments, each fragment only once the text so far is a valid prefix of a JSON object. Text
// that turns out not to be a call before any header was sent falls back to content whole; text
// that breaks the family's format after a header was sent ends the calls, and the rest is
// content. String-valued arguments (hermes: "arguments": "{...}") are sent in one piece when the
// call is complete.
class ToolCallStreamer {
 public:
  using Event = ForcedCallStreamer::Event;
  ToolCallStreamer(ToolParser parser, std::vector<std::string> trailing)
      : parser_(parser), trailing_(std::move(trailing)) {}
  // Returns content that can be sent now; appends tool-call deltas to *events.
  std::string Push(std::string_view text, std::vector<Event>* events);
  // At the end of the output: the remaining content (end-of-turn texts removed) and deltas.
  std::string Finish(std::vector<Event>* events);
  // Calls whose header was sent.
  int calls_started() const { return static_cast<int>(sent_.size()); }

 private:
  std::string ReleaseText(bool final);
  std::string Advance(bool final, std::vector<Event>* events);

  ToolParser parser_;
  std::vector<std::string> trailing_;
  enum class Mode { kText, kCalls, kPlain } mode_ = Mode::kText;
  std::string held_;    // kText/kPlain: text not yet sent
  std::string region_;  // kCalls: the text from the call marker on
  bool sent_any_ = false;
  std::vector<size_t> sent_;      // per headed call: argument bytes sent
  std::vector<size_t> sent_end_;  // per headed call: where its sent arguments end in region_
};

}  // namespace dh::server
