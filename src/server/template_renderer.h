// A ChatPromptRenderer over the model's Jinja chat template (src/chat): messages become the
// template's `messages` variable (assistant reasoning_content is dropped, as R1 templates
// expect), plus tools, add_generation_prompt, bos/eos tokens and chat_template_kwargs.
#pragma once

#include <memory>
#include <string>

#include "server/chat_prompt.h"

namespace dh::server {

// `source`: the Jinja text. bos/eos: the strings the template may print.
Result<std::unique_ptr<ChatPromptRenderer>> MakeTemplateRenderer(const std::string& source,
                                                                 std::string bos_token,
                                                                 std::string eos_token);

// Finds the template for `model_dir`: `override_value` when given (a file path, or the template
// text itself when no such file exists), else tokenizer_config.json's chat_template. Returns
// the plain renderer when the model has none.
Result<std::unique_ptr<ChatPromptRenderer>> LoadChatRenderer(const std::string& model_dir,
                                                             const std::string& override_value);

}  // namespace dh::server
