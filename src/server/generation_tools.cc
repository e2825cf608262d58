// Tool calls in chat completions: request preparation (forced calls become a grammar), the
// finished choice's tool_calls, and the streamed tool-call deltas.
#include "server/generation_tools.h"

namespace dh::server::internal {
namespace {

bool Forced(const ToolRequest& t) {
  return t.choice == ToolRequest::Choice::kRequired || t.choice == ToolRequest::Choice::kNamed;
}

// OpenAI's streamed tool-call deltas for the events of a streamer.
Json EventDeltas(std::vector<ForcedCallStreamer::Event>& events) {
  Json deltas = Json::array();
  for (ForcedCallStreamer::Event& e : events) {
    Json fn = {{"arguments", std::move(e.arguments)}};
    if (e.id.empty()) {
      deltas.push_back({{"index", e.index}, {"function", std::move(fn)}});
    } else {
      fn["name"] = std::move(e.name);
      deltas.push_back({{"index", e.index}, {"id", e.id}, {"type", "function"}, {"function", std::move(fn)}});
    }
  }
  return deltas;
}

}  // namespace

ToolParser ResolveToolParser(const std::string& name, std::string_view chat_template,
                             const Tokenizer* tokenizer) {
  bool is_auto = false;
  ToolParser parser = ToolParser::kNone;
  if (!ParseToolParserName(name, &is_auto, &parser) || !is_auto) return parser;
  if (ToolParser from_template = DetectToolParser(chat_template); from_template != ToolParser::kNone)
    return from_template;
  if (!tokenizer) return ToolParser::kNone;
  if (tokenizer->TokenToId("<｜tool▁calls▁begin｜>")) return ToolParser::kDeepSeekV3;
  if (tokenizer->TokenToId("<tool_call>")) return ToolParser::kHermes;
  if (tokenizer->TokenToId("<|python_tag|>")) return ToolParser::kLlama3Json;
  return ToolParser::kNone;
}

std::vector<std::string> EndOfTurnTexts(const Tokenizer* tokenizer) {
  std::vector<std::string> out;
  if (!tokenizer) return out;
  if (tokenizer->config().eos_token) out.push_back(*tokenizer->config().eos_token);
  for (const char* t : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "<｜end▁of▁sentence｜>"}) {
    if (tokenizer->TokenToId(t)) out.emplace_back(t);
  }
  return out;
}

std::optional<ApiError> PrepareTools(const Json& body, Job& job, ToolParser parser,
                                     StructuredOutput& structured) {
  auto parsed = ParseToolRequest(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  ToolRequest& t = std::get<ToolRequest>(parsed);
  if (t.choice == ToolRequest::Choice::kNone) return std::nullopt;
  if (Forced(t)) {
    if (job.grammar)
      return BadRequest("tool_choice", "tool_choice 'required' or a named function cannot be combined "
                                       "with response_format or guided decoding");
    StructuredSpec spec;
    spec.kind = StructuredSpec::Kind::kJsonSchema;
    spec.schema = t.forced_schema;
    spec.param = "tools";
    auto compiled = structured.Compile(spec, nullptr);
    if (auto* e = std::get_if<ApiError>(&compiled)) return *e;
    job.grammar = std::get<StructuredOutput::Compiled>(compiled);
  } else if (parser == ToolParser::kNone) {
    return std::nullopt;  // auto without a parser: plain content, as vLLM without one
  } else {
    // The parsers read the family's special tokens, so they must reach the text.
    job.sampling.skip_special_tokens = false;
  }
  job.tools = std::move(t);
  job.tool_parser = parser;
  return std::nullopt;
}

void ApplyToolCalls(const Job& job, const ChoiceState& c, ChatChoice* choice) {
  if (!job.tools) return;
  const std::string text = choice->content.value_or("");
  std::vector<ToolCall> calls;
  if (Forced(*job.tools)) {
    calls = ForcedCallsFromOutput(*job.tools, text);
    if (!calls.empty()) choice->content.reset();
  } else {
    ToolParseResult r = ParseToolCalls(job.tool_parser, text, job.tool_trailing);
    calls = std::move(r.calls);
    if (calls.empty() || !r.content.empty()) {
      choice->content = r.content;
    } else {
      choice->content.reset();
    }
  }
  if (calls.empty()) return;
  choice->tool_calls = ToolCallsJson(calls);
  if (choice->finish_reason == "stop") choice->finish_reason = "tool_calls";
}

void StreamToolDelta(Job& job, ChoiceState& c, bool finished, ChatDelta* delta,
                     std::optional<std::string>* finish_reason) {
  if (!job.tools) return;
  std::string text = delta->content.value_or("");
  delta->content.reset();
  if (job.tools->choice == ToolRequest::Choice::kNamed) {
    // The output is the arguments: a header delta (id, name), then argument fragments.
    if (c.tool_id.empty()) {
      c.tool_id = NewToolCallId();
      delta->tool_calls = Json::array({{{"index", 0}, {"id", c.tool_id}, {"type", "function"},
                                        {"function", {{"name", job.tools->named}, {"arguments", text}}}}});
    } else if (!text.empty()) {
      delta->tool_calls = Json::array({{{"index", 0}, {"function", {{"arguments", text}}}}});
    }
    if (finished && finish_reason && *finish_reason == "stop") *finish_reason = "tool_calls";
    return;
  }
  if (Forced(*job.tools)) {
    // "required": a JSON array of calls; each call's header once its name is complete, then its
    // arguments in fragments.
    if (!c.forced_stream) c.forced_stream = std::make_shared<ForcedCallStreamer>();
    c.tool_text += text;
    std::vector<ForcedCallStreamer::Event> events;
    c.forced_stream->Push(text, &events);
    Json deltas = EventDeltas(events);
    if (!deltas.empty()) delta->tool_calls = std::move(deltas);
    if (!finished) return;
    if (c.forced_stream->calls_started() == 0) {
      delta->content = c.tool_text;  // cut short (length) before any call: what there is, as content
      return;
    }
    if (finish_reason && *finish_reason == "stop") *finish_reason = "tool_calls";
    return;
  }
  // auto: content until a call marker, then each call's header and argument fragments.
  if (!c.tool_stream) c.tool_stream = std::make_shared<ToolCallStreamer>(job.tool_parser, job.tool_trailing);
  std::vector<ForcedCallStreamer::Event> events;
  std::string now = c.tool_stream->Push(text, &events);
  if (finished) now += c.tool_stream->Finish(&events);
  if (!events.empty()) delta->tool_calls = EventDeltas(events);
  if (finished && c.tool_stream->calls_started() > 0 && finish_reason && *finish_reason == "stop")
    *finish_reason = "tool_calls";
  if (!now.empty()) delta->content = std::move(now);
}

}  // namespace dh::server::internal
