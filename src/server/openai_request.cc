// Validation of OpenAI chat/completions/tokenize bodies into native structs. Every error names
// the field (`param`) and the expected type or range; none echoes the client's value.
#include "server/openai_request.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace dh::server {
namespace {

using Error = std::optional<ApiError>;

// A JSON value that is absent or null is "not given".
const Json* Field(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Error TypeError(const std::string& param, const char* expected) {
  return BadRequest(param, fmt::format("'{}' must be {}", param, expected));
}

Error RangeError(const std::string& param, const std::string& range) {
  return BadRequest(param, fmt::format("'{}' must be {}", param, range));
}

// Reads an integer (JSON integer literal only; 1.5 and 1e30 are rejected) within [lo, hi].
Error ReadInt(const Json& v, const std::string& param, int64_t lo, int64_t hi, int64_t* out) {
  int64_t value = 0;
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return RangeError(param, fmt::format("an integer in [{}, {}]", lo, hi));
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else {
    return TypeError(param, "an integer");
  }
  if (value < lo || value > hi) return RangeError(param, fmt::format("an integer in [{}, {}]", lo, hi));
  *out = value;
  return std::nullopt;
}

Error GetInt(const Json& obj, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  return ReadInt(*v, key, lo, hi, out);
}

Error GetOptInt(const Json& obj, const char* key, int64_t lo, int64_t hi,
                std::optional<int64_t>* out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  int64_t value = 0;
  if (auto e = ReadInt(*v, key, lo, hi, &value)) return e;
  *out = value;
  return std::nullopt;
}

Error GetInt32(const Json& obj, const char* key, int64_t lo, int64_t hi, int* out) {
  int64_t value = *out;
  if (auto e = GetInt(obj, key, lo, hi, &value)) return e;
  *out = static_cast<int>(value);
  return std::nullopt;
}

// Reads a finite number in [lo, hi] (or (lo, hi] when lo_open).
Error GetNumber(const Json& obj, const char* key, double lo, double hi, bool lo_open,
                double* out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return TypeError(key, "a number");
  double value = v->get<double>();
  bool ok = std::isfinite(value) && value <= hi && (lo_open ? value > lo : value >= lo);
  if (!ok) return RangeError(key, fmt::format("a number in {}{}, {}]", lo_open ? "(" : "[", lo, hi));
  *out = value;
  return std::nullopt;
}

Error GetBool(const Json& obj, const char* key, bool* out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return TypeError(key, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

Error GetString(const Json& obj, const char* key, std::optional<std::string>* out) {
  const Json* v = Field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return TypeError(key, "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

Error ReadTokenId(const Json& v, const std::string& param, const ModelLimits& model,
                  int32_t* out) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) return TypeError(param, "an integer token id");
  // Unsigned values above INT64_MAX are out of vocabulary too.
  const bool in_vocab = v.is_number_unsigned()
                            ? v.get<uint64_t>() < static_cast<uint64_t>(model.vocab_size)
                            : v.get<int64_t>() >= 0 && v.get<int64_t>() < model.vocab_size;
  if (!in_vocab) {
    return BadRequest(param, fmt::format("'{}' contains a token id out of vocabulary (valid: 0 "
                                         "to {})", param, model.vocab_size - 1));
  }
  *out = static_cast<int32_t>(v.get<int64_t>());
  return std::nullopt;
}

Error ReadTokenIds(const Json& v, const std::string& param, const ModelLimits& model,
                   std::vector<int32_t>* out) {
  if (!v.is_array()) return TypeError(param, "an array of token ids");
  out->reserve(v.size());
  for (const Json& item : v) {
    int32_t id = 0;
    if (auto e = ReadTokenId(item, param, model, &id)) return e;
    out->push_back(id);
  }
  return std::nullopt;
}

Error ParseStop(const Json& obj, const RequestLimits& limits, std::vector<std::string>* out) {
  const Json* v = Field(obj, "stop");
  if (!v) return std::nullopt;
  std::vector<const Json*> items;
  if (v->is_string()) {
    items.push_back(v);
  } else if (v->is_array()) {
    if (v->size() > static_cast<size_t>(limits.max_stop_strings))
      return RangeError("stop", fmt::format("at most {} strings", limits.max_stop_strings));
    for (const Json& s : *v) items.push_back(&s);
  } else {
    return TypeError("stop", "a string or an array of strings");
  }
  for (const Json* s : items) {
    if (!s->is_string()) return TypeError("stop", "a string or an array of strings");
    const std::string& text = s->get_ref<const std::string&>();
    if (text.size() > limits.max_stop_string_bytes)
      return RangeError("stop", fmt::format("strings of at most {} bytes", limits.max_stop_string_bytes));
    if (!text.empty()) out->push_back(text);  // an empty stop string can never match: ignored
  }
  return std::nullopt;
}

Error ParseLogitBias(const Json& obj, const RequestLimits& limits, const ModelLimits& model,
                     std::vector<std::pair<int32_t, float>>* out) {
  const Json* v = Field(obj, "logit_bias");
  if (!v) return std::nullopt;
  if (!v->is_object()) return TypeError("logit_bias", "an object mapping token ids to numbers");
  if (v->size() > static_cast<size_t>(limits.max_logit_bias))
    return RangeError("logit_bias", fmt::format("an object with at most {} entries", limits.max_logit_bias));
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || ptr != key.data() + key.size() || key.empty())
      return BadRequest("logit_bias", "'logit_bias' keys must be token ids written as integers");
    if (id < 0 || id >= model.vocab_size)
      return BadRequest("logit_bias", fmt::format("'logit_bias' contains a token id out of vocabulary (valid: 0 to {})",
                                                  model.vocab_size - 1));
    if (!it->is_number()) return TypeError("logit_bias", "an object mapping token ids to numbers");
    double bias = it->get<double>();
    if (!std::isfinite(bias) || bias < -100 || bias > 100)
      return RangeError("logit_bias", "an object whose values are in [-100, 100]");
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

// Fields shared by chat and completions.
Error ParseSampling(const Json& obj, const RequestLimits& limits, const ModelLimits& model,
                    SamplingOptions* s) {
  if (auto e = GetNumber(obj, "temperature", 0, 2, false, &s->temperature)) return e;
  if (auto e = GetNumber(obj, "top_p", 0, 1, true, &s->top_p)) return e;
  if (auto e = GetInt32(obj, "top_k", -1, std::numeric_limits<int32_t>::max(), &s->top_k)) return e;
  if (auto e = GetNumber(obj, "min_p", 0, 1, false, &s->min_p)) return e;
  if (auto e = GetNumber(obj, "presence_penalty", -2, 2, false, &s->presence_penalty)) return e;
  if (auto e = GetNumber(obj, "frequency_penalty", -2, 2, false, &s->frequency_penalty)) return e;
  if (auto e = GetNumber(obj, "repetition_penalty", 0, 10, true, &s->repetition_penalty)) return e;
  if (auto e = ParseLogitBias(obj, limits, model, &s->logit_bias)) return e;
  if (const Json* v = Field(obj, "seed")) {
    int64_t seed = 0;
    if (auto e = ReadInt(*v, "seed", std::numeric_limits<int64_t>::min(), limits.max_seed, &seed))
      return e;
    s->seed = seed;
  }
  if (auto e = ParseStop(obj, limits, &s->stop)) return e;
  if (const Json* v = Field(obj, "stop_token_ids")) {
    if (!v->is_array()) return TypeError("stop_token_ids", "an array of token ids");
    if (v->size() > static_cast<size_t>(limits.max_stop_token_ids))
      return RangeError("stop_token_ids", fmt::format("at most {} token ids", limits.max_stop_token_ids));
    if (auto e = ReadTokenIds(*v, "stop_token_ids", model, &s->stop_token_ids)) return e;
  }
  if (auto e = GetBool(obj, "include_stop_str_in_output", &s->include_stop_str_in_output)) return e;
  const int64_t max_len = model.max_model_len > 0 ? model.max_model_len
                                                  : std::numeric_limits<int32_t>::max();
  if (auto e = GetOptInt(obj, "max_tokens", 1, std::numeric_limits<int32_t>::max(), &s->max_tokens))
    return e;
  std::optional<int64_t> max_completion;
  if (auto e = GetOptInt(obj, "max_completion_tokens", 1, std::numeric_limits<int32_t>::max(),
                         &max_completion))
    return e;
  if (max_completion) s->max_tokens = max_completion;
  if (auto e = GetInt(obj, "min_tokens", 0, max_len, &s->min_tokens)) return e;
  if (s->max_tokens && s->min_tokens > *s->max_tokens)
    return BadRequest("min_tokens", "'min_tokens' must not exceed 'max_tokens'");
  if (auto e = GetBool(obj, "ignore_eos", &s->ignore_eos)) return e;
  if (auto e = GetInt32(obj, "n", 1, limits.max_n, &s->n)) return e;
  if (const Json* v = Field(obj, "best_of")) {
    int64_t best_of = 0;
    if (auto e = ReadInt(*v, "best_of", 1, limits.max_n, &best_of)) return e;
    if (best_of != s->n)
      return BadRequest("best_of", "'best_of' different from 'n' is not supported");
  }
  if (auto e = GetBool(obj, "skip_special_tokens", &s->skip_special_tokens)) return e;
  return std::nullopt;
}

Error ParseStreamOptions(const Json& obj, StreamOptions* out) {
  if (auto e = GetBool(obj, "stream", &out->stream)) return e;
  const Json* v = Field(obj, "stream_options");
  if (!v) return std::nullopt;
  if (!v->is_object()) return TypeError("stream_options", "an object");
  if (!out->stream)
    return BadRequest("stream_options", "'stream_options' is only allowed when 'stream' is true");
  if (const Json* u = Field(*v, "include_usage")) {
    if (!u->is_boolean()) return TypeError("stream_options.include_usage", "a boolean");
    out->include_usage = u->get<bool>();
  }
  if (const Json* u = Field(*v, "continuous_usage_stats")) {
    if (!u->is_boolean()) return TypeError("stream_options.continuous_usage_stats", "a boolean");
    out->continuous_usage_stats = u->get<bool>();
  }
  return std::nullopt;
}

// Message content: a string, or an array of text parts joined with "\n".
Error ReadContent(const Json& v, const std::string& param, std::optional<std::string>* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return TypeError(param, "a string or an array of content parts");
  std::string joined;
  bool first = true;
  for (const Json& part : v) {
    if (!part.is_object()) return TypeError(param, "an array of content part objects");
    const Json* type = Field(part, "type");
    if (!type || !type->is_string()) return TypeError(param + ".type", "a string");
    const std::string& t = type->get_ref<const std::string&>();
    if (t != "text" && t != "refusal")
      return BadRequest(param, fmt::format("content parts of type other than 'text' are not "
                                           "supported by this text-only model (in '{}')", param));
    const Json* text = Field(part, t == "text" ? "text" : "refusal");
    if (!text || !text->is_string()) return TypeError(param + ".text", "a string");
    if (!first) joined += "\n";
    joined += text->get_ref<const std::string&>();
    first = false;
  }
  *out = std::move(joined);
  return std::nullopt;
}

Error ParseMessages(const Json& obj, bool allow_empty, std::vector<ChatMessage>* out) {
  const Json* v = Field(obj, "messages");
  if (!v) return BadRequest("messages", "'messages' is required");
  if (!v->is_array()) return TypeError("messages", "an array of message objects");
  if (v->empty() && !allow_empty) return BadRequest("messages", "'messages' must not be empty");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) return TypeError(param, "an object");
    const Json* role = Field(m, "role");
    if (!role) return BadRequest(param + ".role", fmt::format("'{}.role' is required", param));
    if (!role->is_string()) return TypeError(param + ".role", "a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return BadRequest(param + ".role", fmt::format("'{}.role' must be one of system, developer, "
                                                     "user, assistant, tool", param));
    if (const Json* c = Field(m, "content")) {
      if (auto e = ReadContent(*c, param + ".content", &msg.content)) return e;
    } else if (msg.role != "assistant") {
      return BadRequest(param + ".content", fmt::format("'{}.content' is required", param));
    }
    if (auto e = GetString(m, "name", &msg.name)) return e;
    if (auto e = GetString(m, "reasoning_content", &msg.reasoning_content)) return e;
    if (auto e = GetString(m, "tool_call_id", &msg.tool_call_id)) return e;
    if (msg.role == "tool" && !msg.tool_call_id)
      return BadRequest(param + ".tool_call_id", fmt::format("'{}.tool_call_id' is required for "
                                                             "tool messages", param));
    if (const Json* tc = Field(m, "tool_calls")) {
      if (!tc->is_array()) return TypeError(param + ".tool_calls", "an array");
      msg.tool_calls = *tc;
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

Error ParseModel(const Json& obj, std::string* out) {
  const Json* v = Field(obj, "model");
  if (!v) return std::nullopt;  // optional: the server fills in its served model
  if (!v->is_string()) return TypeError("model", "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

}  // namespace

std::variant<ChatCompletionRequest, ApiError> ParseChatCompletionRequest(
    const Json& body, const RequestLimits& limits, const ModelLimits& model) {
  ChatCompletionRequest r;
  Error e = ParseModel(body, &r.model);
  if (!e) e = ParseMessages(body, /*allow_empty=*/false, &r.messages);
  if (!e) e = ParseSampling(body, limits, model, &r.sampling);
  if (!e) e = ParseStreamOptions(body, &r.stream);
  if (e) return *e;
  if (const Json* v = Field(body, "logprobs")) {
    if (!v->is_boolean()) return *TypeError("logprobs", "a boolean");
    r.sampling.logprobs = v->get<bool>();
  }
  if (const Json* v = Field(body, "top_logprobs")) {
    int64_t top = 0;
    if (auto err = ReadInt(*v, "top_logprobs", 0, limits.max_top_logprobs, &top)) return *err;
    if (!r.sampling.logprobs)
      return BadRequest("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    r.sampling.top_logprobs = static_cast<int>(top);
  }
  if (const Json* v = Field(body, "response_format")) {
    const Json* type = v->is_object() ? Field(*v, "type") : nullptr;
    if (!type || !type->is_string()) return *TypeError("response_format", "an object with a 'type'");
    const std::string t = type->get<std::string>();
    if (t != "text" && t != "json_object" && t != "json_schema")  // the rest: structured_output.cc
      return BadRequest("response_format", "response_format type must be 'text', 'json_object' or "
                                           "'json_schema'");
  }
  if (const Json* v = Field(body, "tools")) {
    if (!v->is_array()) return *TypeError("tools", "an array");
    r.tools = *v;
  }
  if (const Json* v = Field(body, "tool_choice")) {
    if (!v->is_object() && (!v->is_string() || (*v != "none" && *v != "auto" && *v != "required")))
      return BadRequest("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if (auto err = GetBool(body, "add_generation_prompt", &r.add_generation_prompt)) return *err;
  if (auto err = GetBool(body, "continue_final_message", &r.continue_final_message)) return *err;
  if (r.continue_final_message && r.add_generation_prompt && Field(body, "add_generation_prompt"))
    return BadRequest("continue_final_message",
                      "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  if (r.continue_final_message) r.add_generation_prompt = false;
  if (auto err = GetBool(body, "include_reasoning", &r.include_reasoning)) return *err;
  if (const Json* v = Field(body, "chat_template_kwargs")) {
    if (!v->is_object()) return *TypeError("chat_template_kwargs", "an object");
    if (v->contains("chat_template") && !limits.allow_request_chat_template)
      return BadRequest("chat_template_kwargs", "request-supplied chat templates are not allowed");
    r.chat_template_kwargs = *v;
  }
  if (auto err = GetString(body, "chat_template", &r.chat_template)) return *err;
  if (r.chat_template && !limits.allow_request_chat_template)
    return BadRequest("chat_template", "request-supplied chat templates are not allowed");
  return r;
}

std::variant<CompletionRequest, ApiError> ParseCompletionRequest(const Json& body,
                                                                 const RequestLimits& limits,
                                                                 const ModelLimits& model) {
  CompletionRequest r;
  Error e = ParseModel(body, &r.model);
  if (!e) e = ParseSampling(body, limits, model, &r.sampling);
  if (!e) e = ParseStreamOptions(body, &r.stream);
  if (!e) e = GetBool(body, "echo", &r.echo);
  if (!e) e = GetBool(body, "add_special_tokens", &r.add_special_tokens);
  if (e) return *e;
  if (const Json* v = Field(body, "logprobs")) {
    int64_t lp = 0;
    if (auto err = ReadInt(*v, "logprobs", 0, limits.max_completion_logprobs, &lp)) return *err;
    r.logprobs = static_cast<int>(lp);
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = static_cast<int>(lp);
  }
  if (const Json* v = Field(body, "suffix")) {
    if (!v->is_string()) return *TypeError("suffix", "a string");
    if (!v->get_ref<const std::string&>().empty())
      return BadRequest("suffix", "'suffix' is not supported");
  }
  const Json* p = Field(body, "prompt");
  if (!p) return BadRequest("prompt", "'prompt' is required");
  const char* kShape = "a string, an array of strings, an array of token ids or an array of "
                       "token id arrays";
  const std::string empty_msg = "'prompt' must be non-empty";
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) return BadRequest("prompt", empty_msg);
    r.prompts.emplace_back(p->get<std::string>());
  } else if (p->is_array()) {
    if (p->empty()) return BadRequest("prompt", empty_msg);
    const Json& first = p->front();
    if (first.is_number()) {
      std::vector<int32_t> ids;
      if (auto err = ReadTokenIds(*p, "prompt", model, &ids)) return *err;
      r.prompts.emplace_back(std::move(ids));
    } else {
      if (p->size() > static_cast<size_t>(limits.max_prompts))
        return *RangeError("prompt", fmt::format("an array of at most {} prompts", limits.max_prompts));
      for (const Json& item : *p) {
        if (item.is_string()) {
          if (item.get_ref<const std::string&>().empty()) return BadRequest("prompt", empty_msg);
          r.prompts.emplace_back(item.get<std::string>());
        } else if (item.is_array()) {
          if (item.empty()) return BadRequest("prompt", empty_msg);
          std::vector<int32_t> ids;
          if (auto err = ReadTokenIds(item, "prompt", model, &ids)) return *err;
          r.prompts.emplace_back(std::move(ids));
        } else {
          return *TypeError("prompt", kShape);
        }
      }
    }
  } else {
    return *TypeError("prompt", kShape);
  }
  if (static_cast<int64_t>(r.prompts.size()) * r.sampling.n > limits.max_prompts)
    return BadRequest("n", fmt::format("the number of prompts times 'n' must be at most {}",
                                       limits.max_prompts));
  return r;
}

std::variant<TokenizeRequest, ApiError> ParseTokenizeRequest(const Json& body) {
  TokenizeRequest r;
  Error e = GetString(body, "model", &r.model);
  if (!e) e = GetString(body, "prompt", &r.prompt);
  if (!e) e = GetBool(body, "add_special_tokens", &r.add_special_tokens);
  if (!e) e = GetBool(body, "add_generation_prompt", &r.add_generation_prompt);
  if (e) return *e;
  if (!r.prompt) {
    if (!Field(body, "messages")) return BadRequest("prompt", "'prompt' or 'messages' is required");
    if (auto err = ParseMessages(body, /*allow_empty=*/false, &r.messages)) return *err;
  }
  return r;
}

std::variant<DetokenizeRequest, ApiError> ParseDetokenizeRequest(const Json& body,
                                                                 const ModelLimits& model) {
  DetokenizeRequest r;
  if (auto e = GetString(body, "model", &r.model)) return *e;
  const Json* t = Field(body, "tokens");
  if (!t) return BadRequest("tokens", "'tokens' is required");
  if (auto e = ReadTokenIds(*t, "tokens", model, &r.tokens)) return *e;
  return r;
}

std::optional<ApiError> CheckContextLength(int64_t prompt_tokens, int64_t max_model_len,
                                           std::optional<int64_t>* max_tokens,
                                           int64_t default_max_tokens) {
  if (prompt_tokens >= max_model_len) {
    return BadRequest("messages",
                      fmt::format("This model's maximum context length is {} tokens, but the "
                                  "prompt has {} tokens",
                                  max_model_len, prompt_tokens),
                      "context_length_exceeded");
  }
  const int64_t room = max_model_len - prompt_tokens;
  if (!max_tokens->has_value()) {
    *max_tokens = default_max_tokens > 0 ? std::min(default_max_tokens, room) : room;
    return std::nullopt;
  }
  if (**max_tokens > room) {
    return BadRequest("max_tokens",
                      fmt::format("This model's maximum context length is {} tokens; the prompt "
                                  "has {} tokens and max_tokens asks for {} more",
                                  max_model_len, prompt_tokens, **max_tokens),
                      "context_length_exceeded");
  }
  return std::nullopt;
}

}  // namespace dh::server
