// Tool calls inside GenerationService (see tool_calls.h for the formats): preparing a chat job,
// filling a finished choice, and rewriting streamed deltas.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "server/generation_internal.h"
#include "server/tool_calls.h"

namespace dh::server::internal {

// --tool-call-parser: "auto" takes the syntax the chat template writes tool calls in (its call
// marker), and falls back to each family's call marker in the vocabulary when the template names
// none (or there is no template).
ToolParser ResolveToolParser(const std::string& name, std::string_view chat_template,
                             const Tokenizer* tokenizer);
// End-of-turn token texts stripped from the end before parsing (special tokens are kept then).
std::vector<std::string> EndOfTurnTexts(const Tokenizer* tokenizer);

// Reads tools/tool_choice/parallel_tool_calls: a forced call compiles the call schema into
// job.grammar; auto with a parser keeps special tokens in the text for the parser.
std::optional<ApiError> PrepareTools(const Json& body, Job& job, ToolParser parser,
                                     StructuredOutput& structured);

// Moves calls found in choice->content into choice->tool_calls (finish_reason "tool_calls").
void ApplyToolCalls(const Job& job, const ChoiceState& c, ChatChoice* choice);

// Streaming: turns `delta->content` into content to send now and, at the end, tool-call deltas.
void StreamToolDelta(Job& job, ChoiceState& c, bool finished, ChatDelta* delta,
                     std::optional<std::string>* finish_reason);

}  // namespace dh::server::internal
