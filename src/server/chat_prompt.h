// ChatPromptRenderer: turns validated chat messages into the prompt text the model expects.
// The production renderer runs the model's Jinja chat template (src/chat); the plain renderer
// is the fallback for checkpoints that ship no template.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "server/json_util.h"
#include "server/openai_request.h"

namespace dh::server {

class ChatPromptRenderer {
 public:
  virtual ~ChatPromptRenderer() = default;
  // Errors are InvalidArgument (a template raise_exception, a budget exceeded) and become 400.
  virtual Result<std::string> Render(const std::vector<ChatMessage>& messages, const Json& tools,
                                     bool add_generation_prompt, const Json& kwargs) const = 0;
  // True when the generation prompt ends inside an open <think> block (DeepSeek-R1 templates):
  // `serve` then enables the deepseek_r1 reasoning parser by default.
  virtual bool OpensThinkBlock() const { return false; }
  // The template's source text (empty for the plain renderer): `--tool-call-parser auto` reads
  // which tool-call syntax the template writes from it.
  virtual std::string_view Source() const { return {}; }
};

// "<role>: <content>\n" per message, then "assistant:" when a generation prompt is asked for.
std::unique_ptr<ChatPromptRenderer> MakePlainChatRenderer();

}  // namespace dh::server
