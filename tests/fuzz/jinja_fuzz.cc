// Fuzz target: the Jinja chat-template parser and renderer (within the default render limits),
// over a context like a chat request's.
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "fuzz/fuzz_target.h"

DH_FUZZ_TARGET(jinja) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hi <b>there</b>"},
      {"role": "assistant", "content": "<think>hm</think>Hello", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
      {"role": "tool", "content": "42", "tool_call_id": "c1"},
      {"role": "user", "content": [{"type": "text", "text": "and?"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  auto tmpl = dh::chat::ChatTemplate::Parse(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!tmpl.ok()) return 0;
  dh::chat::ChatTemplateLimits limits;
  limits.max_steps = 200'000;  // keeps one input under a second
  (void)tmpl->Render(context, limits);
  return 0;
}
