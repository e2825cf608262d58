// The plain chat renderer (fallback when a checkpoint ships no chat template).
#include "server/chat_prompt.h"

namespace dh::server {
namespace {

class PlainChatRenderer : public ChatPromptRenderer {
 public:
  Result<std::string> Render(const std::vector<ChatMessage>& messages, const Json& tools,
                             bool add_generation_prompt, const Json& kwargs) const override {
    std::string out;
    for (const ChatMessage& m : messages) {
      out += m.role;
      out += ": ";
      out += m.content.value_or("");
      out += "\n";
    }
    if (add_generation_prompt) out += "assistant:";
    return out;
  }
};

}  // namespace

std::unique_ptr<ChatPromptRenderer> MakePlainChatRenderer() {
  return std::make_unique<PlainChatRenderer>();
}

}  // namespace dh::server
