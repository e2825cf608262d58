// Fuzz target: an HTTP request body through the server's parsers (depth pre-scan, JSON, then the
// chat/completions, completions, tokenize and detokenize schemas with their limits).
#include "fuzz/fuzz_target.h"
#include "server/openai_request.h"
#include "server/request_body.h"

DH_FUZZ_TARGET(chat_request) {
  auto body = dh::server::ParseRequestBody(
      std::string_view(reinterpret_cast<const char*>(data), size));
  const auto* json = std::get_if<dh::server::Json>(&body);
  if (!json) return 0;
  const dh::server::RequestLimits limits;
  const dh::server::ModelLimits model{.vocab_size = 1024, .max_model_len = 256};
  (void)dh::server::ParseChatCompletionRequest(*json, limits, model);
  (void)dh::server::ParseCompletionRequest(*json, limits, model);
  (void)dh::server::ParseTokenizeRequest(*json);
  (void)dh::server::ParseDetokenizeRequest(*json, model);
  return 0;
}
