// Front ends that lower user-facing constraint languages to a Grammar:
//   - regular expressions (a practical subset of ECMAScript/PCRE syntax, whole-string match),
//   - GBNF (llama.cpp's grammar format),
//   - choice lists (exactly one of the given strings),
//   - JSON Schema (json_schema.cc) and "any JSON object".
// Errors are InvalidArgument (malformed input) or Unsupported (well-formed but not enforceable),
// with a message naming the construct.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "grammar/grammar.h"

namespace dh::grammar {

// Adds a rule that matches exactly the strings of `pattern`. With `json_string_safe`, character
// classes and '.' leave out '"', '\\' and control characters, so the match can sit unescaped
// inside a JSON string (a literal of those characters is an error).
Result<int32_t> AddRegexRule(GrammarBuilder* builder, std::string_view pattern,
                             const std::string& name, bool json_string_safe);
Result<Grammar> CompileRegex(std::string_view pattern);

Result<Grammar> CompileGbnf(std::string_view text);

Result<Grammar> CompileChoice(const std::vector<std::string>& choices);

struct JsonSchemaOptions {
  // false: keywords that cannot be enforced are skipped and listed in *ignored instead of
  // failing the compile (OpenAI's strict:false / vLLM's lenient mode).
  bool strict = true;
  // true: any JSON whitespace between tokens (at most kMaxWhitespace bytes per gap); false: the
  // compact layout with one optional space after ':' and ','.
  bool any_whitespace = false;
};
inline constexpr int kMaxWhitespace = 4;

// `ignored` (may be null) receives "keyword at path" for each keyword skipped under strict=false.
Result<Grammar> CompileJsonSchema(const nlohmann::json& schema, const JsonSchemaOptions& options,
                                  std::vector<std::string>* ignored);
// Any JSON object (response_format json_object).
Result<Grammar> CompileJsonObject();

}  // namespace dh::grammar
