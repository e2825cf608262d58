// Structured output at the edge: the request fields that ask for constrained decoding
// (OpenAI response_format, vLLM guided_* and structured_outputs, llama.cpp grammar/json_schema)
// parsed into one StructuredSpec, compiled to a grammar (cached), and wrapped as the engine's
// per-sequence TokenConstraint.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/engine.h"
#include "grammar/token_mask.h"
#include "server/api_error.h"
#include "server/json_util.h"

namespace dh::server {

struct StructuredSpec {
  enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kNone;
  Json schema;                       // kJsonSchema
  std::string text;                  // kRegex, kGrammar (GBNF)
  std::vector<std::string> choices;  // kChoice
  // json_schema.strict: false lets keywords that cannot be enforced through with a warning
  // header; absent or true makes them a 400.
  bool strict = true;
  std::string param;  // the request field it came from, for error messages
};

// Reads the structured-output fields of a chat or completion body. More than one of them is a
// 400. Shapes are checked here; schemas and grammars are checked when compiled.
std::variant<StructuredSpec, ApiError> ParseStructuredSpec(const Json& body);

// Compiles specs against one tokenizer's vocabulary. Thread-safe.
class StructuredOutput {
 public:
  StructuredOutput(const Tokenizer* tokenizer, int32_t vocab_size);

  using Compiled = std::shared_ptr<const grammar::CompiledGrammar>;
  // `warnings` receives the keywords skipped under strict=false. Unsupported input is a 400
  // naming the field and the construct.
  std::variant<Compiled, ApiError> Compile(const StructuredSpec& spec,
                                           std::vector<std::string>* warnings);

  // `start_after`: a token id (the reasoning end tag `</think>`) before which output is free;
  // the grammar applies to what follows it, as vLLM does with a reasoning parser.
  static std::shared_ptr<TokenConstraint> NewConstraint(Compiled grammar,
                                                        std::optional<int32_t> start_after = {});

 private:
  const grammar::TokenVocab& Vocab();

  const Tokenizer* tokenizer_;
  int32_t vocab_size_;
  std::mutex mu_;
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  std::map<std::string, Compiled> cache_;
};

}  // namespace dh::server
