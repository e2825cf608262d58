// Builders for OpenAI response JSON (conventions.md a.2-a.4).
#include "server/openai_response.h"

namespace dh::server {
namespace {

Json BytesOf(const std::string& token) {
  Json bytes = Json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

Json OptString(const std::optional<std::string>& s) { return s ? Json(*s) : Json(); }

}  // namespace

Json UsageJson(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", usage.reasoning_tokens}}}};
}

Json ChatLogprobsJson(const std::vector<TokenLogprob>& entries) {
  Json content = Json::array();
  for (const TokenLogprob& e : entries) {
    Json top = Json::array();
    for (const auto& [token, lp] : e.top)
      top.push_back({{"token", token}, {"logprob", lp}, {"bytes", BytesOf(token)}});
    content.push_back({{"token", e.token},
                       {"logprob", e.logprob},
                       {"bytes", BytesOf(e.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

Json CompletionLogprobsJson(const std::vector<CompletionLogprob>& entries) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(),
       offsets = Json::array();
  for (const CompletionLogprob& e : entries) {
    tokens.push_back(e.token);
    token_logprobs.push_back(e.logprob ? Json(*e.logprob) : Json());
    if (e.has_top) {
      Json top = Json::object();
      for (const auto& [token, lp] : e.top) top[token] = lp;
      top_logprobs.push_back(std::move(top));
    } else {
      top_logprobs.push_back(nullptr);
    }
    offsets.push_back(e.text_offset);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(offsets)}};
}

Json ChatCompletionJson(const ResponseMeta& meta, const std::vector<ChatChoice>& choices,
                        const Usage& usage) {
  Json out_choices = Json::array();
  for (const ChatChoice& c : choices) {
    Json message = {{"role", "assistant"}, {"content", OptString(c.content)}, {"refusal", nullptr}};
    if (c.reasoning_content) message["reasoning_content"] = *c.reasoning_content;
    if (!c.tool_calls.is_null()) message["tool_calls"] = c.tool_calls;
    out_choices.push_back({{"index", c.index},
                           {"message", std::move(message)},
                           {"logprobs", c.has_logprobs ? ChatLogprobsJson(c.logprobs) : Json()},
                           {"finish_reason", c.finish_reason},
                           {"stop_reason", OptString(c.stop_reason)}});
  }
  return {{"id", meta.id},
          {"object", "chat.completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", meta.system_fingerprint},
          {"choices", std::move(out_choices)},
          {"usage", UsageJson(usage)}};
}

Json CompletionJson(const ResponseMeta& meta, const std::vector<CompletionChoice>& choices,
                    const Usage& usage) {
  Json out_choices = Json::array();
  for (const CompletionChoice& c : choices) {
    out_choices.push_back({{"index", c.index},
                           {"text", c.text},
                           {"logprobs", c.has_logprobs ? CompletionLogprobsJson(c.logprobs) : Json()},
                           {"finish_reason", c.finish_reason},
                           {"stop_reason", OptString(c.stop_reason)}});
  }
  return {{"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", meta.system_fingerprint},
          {"choices", std::move(out_choices)},
          {"usage", UsageJson(usage)}};
}

Json ChatChunkJson(const ResponseMeta& meta, int index, const ChatDelta& delta,
                   const std::optional<std::string>& finish_reason, const Json& logprobs,
                   const Json& usage) {
  Json d = Json::object();
  if (delta.role) d["role"] = "assistant";
  if (delta.content) d["content"] = *delta.content;
  if (delta.reasoning_content) d["reasoning_content"] = *delta.reasoning_content;
  if (!delta.tool_calls.is_null()) d["tool_calls"] = delta.tool_calls;
  Json choice = {{"index", index},
                 {"delta", std::move(d)},
                 {"logprobs", logprobs},
                 {"finish_reason", OptString(finish_reason)}};
  return {{"id", meta.id},
          {"object", "chat.completion.chunk"},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", meta.system_fingerprint},
          {"choices", Json::array({std::move(choice)})},
          {"usage", usage}};
}

Json CompletionChunkJson(const ResponseMeta& meta, int index, const std::string& text,
                         const std::optional<std::string>& finish_reason, const Json& logprobs,
                         const Json& usage) {
  Json choice = {{"index", index},
                 {"text", text},
                 {"logprobs", logprobs},
                 {"finish_reason", OptString(finish_reason)}};
  return {{"id", meta.id},
          {"object", "text_completion"},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", meta.system_fingerprint},
          {"choices", Json::array({std::move(choice)})},
          {"usage", usage}};
}

Json UsageChunkJson(const ResponseMeta& meta, const char* object, const Usage& usage) {
  return {{"id", meta.id},
          {"object", object},
          {"created", meta.created},
          {"model", meta.model},
          {"system_fingerprint", meta.system_fingerprint},
          {"choices", Json::array()},
          {"usage", UsageJson(usage)}};
}

std::string SseEvent(const Json& payload) { return "data: " + SafeDump(payload) + "\n\n"; }

}  // namespace dh::server
