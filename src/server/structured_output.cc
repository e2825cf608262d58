// Structured-output request fields, the compile cache and the engine constraint.
#include "server/structured_output.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "grammar/compilers.h"

namespace dh::server {
namespace {

const Json* Member(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// A schema given as an object or as JSON text (vLLM accepts both).
std::optional<ApiError> ReadSchema(const Json& v, const std::string& param, Json* out) {
  if (v.is_object() || v.is_boolean()) {
    *out = v;
    return std::nullopt;
  }
  if (v.is_string()) {
    Json parsed = Json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean()))
      return BadRequest(param, fmt::format("'{}' must be a JSON Schema object", param));
    *out = std::move(parsed);
    return std::nullopt;
  }
  return BadRequest(param, fmt::format("'{}' must be a JSON Schema object", param));
}

std::optional<ApiError> ReadChoices(const Json& v, const std::string& param, std::vector<std::string>* out) {
  if (!v.is_array() || v.empty() || v.size() > 1024)
    return BadRequest(param, fmt::format("'{}' must be a non-empty array of at most 1024 strings", param));
  for (const Json& c : v) {
    if (!c.is_string()) return BadRequest(param, fmt::format("'{}' must hold strings", param));
    out->push_back(c.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> ReadText(const Json& v, const std::string& param, std::string* out) {
  if (!v.is_string() || v.get<std::string>().empty())
    return BadRequest(param, fmt::format("'{}' must be a non-empty string", param));
  *out = v.get<std::string>();
  return std::nullopt;
}

class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(StructuredOutput::Compiled g, int32_t start_after)
      : matcher_(std::move(g)), start_after_(start_after) {}

  bool Mask(std::span<float> logits, std::span<const int32_t> eos_ids) override {
    if (start_after_ >= 0) return true;  // still reasoning: free text until the end tag
    const std::shared_ptr<const grammar::TokenBitmask> mask = matcher_.AllowedTokens();
    const bool may_end = matcher_.IsAccepting();
    saved_.clear();
    if (may_end) {
      for (int32_t id : eos_ids)
        if (id >= 0 && static_cast<size_t>(id) < logits.size()) saved_.emplace_back(id, logits[id]);
    }
    const float ninf = -std::numeric_limits<float>::infinity();
    bool any = false;
    const size_t n = logits.size();
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t bits = w < mask->size() ? (*mask)[w] : 0;
      if (bits == ~uint64_t{0}) {
        any = true;
        continue;
      }
      if (bits) any = true;
      const size_t end = std::min(n, w * 64 + 64);
      for (size_t i = w * 64; i < end; ++i)
        if (!((bits >> (i - w * 64)) & 1)) logits[i] = ninf;
    }
    for (auto [id, v] : saved_) logits[id] = v;
    return any || !saved_.empty();
  }

  void Accept(int32_t token) override {
    if (start_after_ >= 0) {
      if (token == start_after_) start_after_ = -1;
      return;
    }
    // EOS (or a token the mask allowed, which always advances) — nothing to do when rejected.
    (void)matcher_.AcceptToken(token);
  }

 private:
  grammar::TokenMatcher matcher_;
  int32_t start_after_;  // >= 0: unconstrained until this token (the reasoning end tag) is sampled
  std::vector<std::pair<int32_t, float>> saved_;
};

}  // namespace

std::variant<StructuredSpec, ApiError> ParseStructuredSpec(const Json& body) {
  StructuredSpec spec;
  int count = 0;
  auto take = [&](StructuredSpec::Kind kind, const char* param) {
    ++count;
    spec.kind = kind;
    spec.param = param;
  };
  if (const Json* rf = Member(body, "response_format"); rf && rf->is_object()) {
    const Json* type = Member(*rf, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t == "json_object") {
      take(StructuredSpec::Kind::kJsonObject, "response_format");
    } else if (t == "json_schema") {
      take(StructuredSpec::Kind::kJsonSchema, "response_format.json_schema");
      const Json* js = Member(*rf, "json_schema");
      if (!js || !js->is_object())
        return BadRequest("response_format.json_schema", "'response_format.json_schema' must be an object");
      const Json* schema = Member(*js, "schema");
      if (!schema) return BadRequest("response_format.json_schema.schema", "a JSON Schema is required");
      if (auto e = ReadSchema(*schema, "response_format.json_schema.schema", &spec.schema)) return *e;
      if (const Json* strict = Member(*js, "strict")) {
        if (!strict->is_boolean())
          return BadRequest("response_format.json_schema.strict", "'strict' must be a boolean");
        spec.strict = strict->get<bool>();
      }
    }
  }
  if (const Json* v = Member(body, "guided_json")) {
    take(StructuredSpec::Kind::kJsonSchema, "guided_json");
    if (auto e = ReadSchema(*v, "guided_json", &spec.schema)) return *e;
  }
  if (const Json* v = Member(body, "json_schema")) {  // llama.cpp
    take(StructuredSpec::Kind::kJsonSchema, "json_schema");
    if (auto e = ReadSchema(*v, "json_schema", &spec.schema)) return *e;
  }
  if (const Json* v = Member(body, "guided_choice")) {
    take(StructuredSpec::Kind::kChoice, "guided_choice");
    if (auto e = ReadChoices(*v, "guided_choice", &spec.choices)) return *e;
  }
  if (const Json* v = Member(body, "guided_regex")) {
    take(StructuredSpec::Kind::kRegex, "guided_regex");
    if (auto e = ReadText(*v, "guided_regex", &spec.text)) return *e;
  }
  for (const char* k : {"guided_grammar", "grammar"}) {
    if (const Json* v = Member(body, k)) {
      take(StructuredSpec::Kind::kGrammar, k);
      if (auto e = ReadText(*v, k, &spec.text)) return *e;
    }
  }
  if (const Json* so = Member(body, "structured_outputs")) {
    if (!so->is_object()) return BadRequest("structured_outputs", "'structured_outputs' must be an object");
    if (const Json* v = Member(*so, "json")) {
      take(StructuredSpec::Kind::kJsonSchema, "structured_outputs.json");
      if (auto e = ReadSchema(*v, "structured_outputs.json", &spec.schema)) return *e;
    }
    if (const Json* v = Member(*so, "choice")) {
      take(StructuredSpec::Kind::kChoice, "structured_outputs.choice");
      if (auto e = ReadChoices(*v, "structured_outputs.choice", &spec.choices)) return *e;
    }
    if (const Json* v = Member(*so, "regex")) {
      take(StructuredSpec::Kind::kRegex, "structured_outputs.regex");
      if (auto e = ReadText(*v, "structured_outputs.regex", &spec.text)) return *e;
    }
    if (const Json* v = Member(*so, "grammar")) {
      take(StructuredSpec::Kind::kGrammar, "structured_outputs.grammar");
      if (auto e = ReadText(*v, "structured_outputs.grammar", &spec.text)) return *e;
    }
    if (const Json* v = Member(*so, "json_object"); v && v->is_boolean() && v->get<bool>())
      take(StructuredSpec::Kind::kJsonObject, "structured_outputs.json_object");
    if (Member(*so, "structural_tag"))
      return BadRequest("structured_outputs.structural_tag", "'structural_tag' is not supported");
  }
  if (count > 1)
    return BadRequest(spec.param, "only one of response_format (json_object/json_schema), guided_json, "
                                  "guided_choice, guided_regex, guided_grammar, structured_outputs, "
                                  "grammar and json_schema may be given");
  return spec;
}

StructuredOutput::StructuredOutput(const Tokenizer* tokenizer, int32_t vocab_size)
    : tokenizer_(tokenizer), vocab_size_(vocab_size) {}

const grammar::TokenVocab& StructuredOutput::Vocab() {
  if (!vocab_) {
    vocab_ = tokenizer_ ? grammar::TokenVocab::FromTokenizer(*tokenizer_, vocab_size_)
                        : grammar::TokenVocab::FromBytes({});
  }
  return *vocab_;
}

std::variant<StructuredOutput::Compiled, ApiError> StructuredOutput::Compile(
    const StructuredSpec& spec, std::vector<std::string>* warnings) {
  using Kind = StructuredSpec::Kind;
  if (!tokenizer_) return BadRequest(spec.param, "structured output needs a tokenizer");
  std::string key = fmt::format("{}|{}|", static_cast<int>(spec.kind), spec.strict ? 1 : 0);
  switch (spec.kind) {
    case Kind::kJsonSchema: key += SafeDump(spec.schema); break;
    case Kind::kChoice: key += SafeDump(Json(spec.choices)); break;
    default: key += spec.text;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end() && spec.strict) return it->second;
  }
  Result<grammar::Grammar> g = InvalidArgument("no constraint");
  switch (spec.kind) {
    case Kind::kNone: return BadRequest(spec.param, "no constraint");
    case Kind::kJsonObject: g = grammar::CompileJsonObject(); break;
    case Kind::kJsonSchema: {
      grammar::JsonSchemaOptions options;
      options.strict = spec.strict;
      g = grammar::CompileJsonSchema(spec.schema, options, warnings);
      break;
    }
    case Kind::kRegex: g = grammar::CompileRegex(spec.text); break;
    case Kind::kChoice: g = grammar::CompileChoice(spec.choices); break;
    case Kind::kGrammar: g = grammar::CompileGbnf(spec.text); break;
  }
  if (!g.ok()) return BadRequest(spec.param, g.status().message());
  std::lock_guard<std::mutex> lock(mu_);
  Vocab();
  auto compiled = std::make_shared<const grammar::CompiledGrammar>(std::move(g).value(), vocab_);
  if (cache_.size() >= 64) cache_.clear();
  cache_[key] = compiled;
  return compiled;
}

std::shared_ptr<TokenConstraint> StructuredOutput::NewConstraint(Compiled grammar,
                                                                std::optional<int32_t> start_after) {
  return std::make_shared<GrammarConstraint>(std::move(grammar),
                                             start_after && *start_after >= 0 ? *start_after : -1);
}

}  // namespace dh::server
