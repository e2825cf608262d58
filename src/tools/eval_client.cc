// HTTP side of eval_client.h: JSON in and out, retries with backoff, lm-eval's token pairing.
#include "tools/eval_client.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "tools/http_target.h"

namespace dh::tools {
namespace {

using Json = nlohmann::json;

}  // namespace

struct CompletionClient::Impl {
  EvalClientOptions options;
  HttpTarget target;
  std::unique_ptr<httplib::Client> http;

  explicit Impl(EvalClientOptions o) : options(std::move(o)) {
    target = *ParseHttpTarget(options.url, "--url");
    http = std::make_unique<httplib::Client>(target.base);
    http->set_keep_alive(true);
    http->set_tcp_nodelay(true);  // a POST is two writes: without it Nagle + delayed ACK add 40 ms
    http->set_read_timeout(options.timeout_s, 0);
    http->set_write_timeout(options.timeout_s, 0);
    http->set_connection_timeout(10, 0);
    if (!options.api_key.empty()) http->set_bearer_token_auth(options.api_key);
  }

  // POSTs JSON; retries connection errors, 429 and 5xx with 1, 2, 4 ... s of backoff.
  Result<Json> Post(const std::string& path, const Json& body) {
    const std::string full = target.prefix + path;
    const std::string text = body.dump(-1, ' ', false, Json::error_handler_t::replace);
    std::string last;
    for (int attempt = 0; attempt <= options.max_retries; ++attempt) {
      if (attempt > 0)
        std::this_thread::sleep_for(std::chrono::seconds(1 << std::min(attempt - 1, 5)));
      auto res = http->Post(full, text, "application/json");
      if (!res) {
        last = fmt::format("POST {}{}: {}", target.base, full, httplib::to_string(res.error()));
        continue;
      }
      if (res->status == 200) {
        Json j = Json::parse(res->body, nullptr, false);
        if (j.is_discarded() || !j.is_object())
          return Internal("POST {}: the response is not a JSON object", full);
        return j;
      }
      last = fmt::format("POST {}: HTTP {}: {}", full, res->status, ServerErrorMessage(res->body));
      if (res->status != 429 && res->status < 500) break;
    }
    return IoError("{}", last);
  }

  Result<std::vector<int64_t>> Tokenize(const std::string& text) {
    auto r = Post("/tokenize",
                  {{"model", options.model}, {"prompt", text}, {"add_special_tokens", true}});
    if (!r.ok()) return r.status();
    if (!r->contains("tokens") || !(*r)["tokens"].is_array())
      return Internal("POST /tokenize: expected a 'tokens' array in the response");
    std::vector<int64_t> ids;
    for (const Json& t : (*r)["tokens"]) {
      if (!t.is_number_integer()) return Internal("POST /tokenize: 'tokens' holds a non-integer");
      ids.push_back(t.get<int64_t>());
    }
    return ids;
  }
};

Result<EvalClientOptions> CompletionClient::Resolve(EvalClientOptions o) {
  auto target = ParseHttpTarget(o.url, "--url");
  if (!target.ok()) return target.status();
  if (o.max_length < 0) return InvalidArgument("--max-length: expected >= 0, got {}", o.max_length);
  httplib::Client http(target->base);
  http.set_connection_timeout(10, 0);
  http.set_read_timeout(60, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  auto res = http.Get(target->prefix + "/v1/models", headers);
  if (!res)
    return IoError("GET {}{}/v1/models: {} (is the server running?)", target->base, target->prefix,
                   httplib::to_string(res.error()));
  if (res->status != 200)
    return IoError("GET /v1/models: HTTP {}: {}", res->status, ServerErrorMessage(res->body));
  Json j = Json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
    return IoError("GET /v1/models: expected a non-empty 'data' list");
  const Json* entry = &j["data"][0];
  if (!o.model.empty()) {
    entry = nullptr;
    for (const Json& m : j["data"])
      if (m.value("id", "") == o.model) entry = &m;
    if (!entry) return InvalidArgument("--model-name '{}': the server does not serve it", o.model);
  }
  o.model = entry->value("id", "");
  if (o.max_length == 0) {
    const int64_t len =
        entry->contains("max_model_len") && (*entry)["max_model_len"].is_number_integer()
            ? (*entry)["max_model_len"].get<int64_t>()
            : 2048;
    o.max_length = static_cast<int>(std::clamp<int64_t>(len - 1, 1, 1 << 24));
  }
  return o;
}

CompletionClient::CompletionClient(EvalClientOptions resolved)
    : impl_(std::make_unique<Impl>(std::move(resolved))) {}
CompletionClient::~CompletionClient() = default;

Result<std::vector<ContinuationScore>> CompletionClient::Loglikelihoods(
    const std::string& context_in, const std::vector<std::string>& continuations) {
  // lm-eval moves the context's trailing spaces onto the continuation.
  std::string context = context_in;
  size_t spaces = 0;
  while (spaces < context.size() && context[context.size() - 1 - spaces] == ' ') ++spaces;
  const std::string moved = context.substr(context.size() - spaces);
  context.resize(context.size() - spaces);

  auto ctx = impl_->Tokenize(context);
  if (!ctx.ok()) return ctx.status();
  const size_t max_length = static_cast<size_t>(impl_->options.max_length);
  Json prompts = Json::array();
  std::vector<ContinuationScore> scores(continuations.size());
  std::vector<size_t> lengths;
  for (size_t i = 0; i < continuations.size(); ++i) {
    auto whole = impl_->Tokenize(context + moved + continuations[i]);
    if (!whole.ok()) return whole.status();
    const size_t n_ctx = std::min(ctx->size(), whole->size());
    const size_t n_cont = whole->size() - n_ctx;
    if (n_cont == 0 || n_cont >= max_length)
      return Internal("continuation '{}' has {} tokens (expected 1 to {})", continuations[i],
                      n_cont, max_length - 1);
    std::vector<int64_t> ids(ctx->begin(), ctx->begin() + n_ctx);
    ids.insert(ids.end(), whole->begin() + n_ctx, whole->end());
    if (ids.size() > max_length) {
      ids.erase(ids.begin(), ids.end() - max_length);
      scores[i].truncated = true;
    }
    scores[i].num_tokens = static_cast<int>(n_cont);
    lengths.push_back(ids.size());
    prompts.push_back(ids);
  }
  Json body = {{"model", impl_->options.model},
               {"prompt", prompts},
               {"max_tokens", 1},
               {"temperature", 0},
               {"logprobs", 1},
               {"echo", true},
               {"seed", impl_->options.seed}};
  auto r = impl_->Post("/v1/completions", body);
  if (!r.ok()) return r.status();
  if (!r->contains("choices") || !(*r)["choices"].is_array() ||
      (*r)["choices"].size() != continuations.size())
    return Internal("POST /v1/completions: expected {} choices", continuations.size());
  for (const Json& c : (*r)["choices"]) {
    const size_t index = c.value("index", size_t{0});
    if (index >= continuations.size() || !c.contains("logprobs") || !c["logprobs"].is_object() ||
        !c["logprobs"].contains("token_logprobs") || !c["logprobs"]["token_logprobs"].is_array())
      return Internal(
          "POST /v1/completions: a choice lacks logprobs.token_logprobs (does the server "
          "support echo with prompt logprobs?)");
    const Json& lp = c["logprobs"]["token_logprobs"];
    if (lp.size() < lengths[index])
      return Internal("POST /v1/completions: {} prompt logprobs for a {}-token prompt", lp.size(),
                      lengths[index]);
    double sum = 0;
    for (size_t t = lengths[index] - scores[index].num_tokens; t < lengths[index]; ++t) {
      if (!lp[t].is_number())
        return Internal("POST /v1/completions: no logprob for prompt token {}", t);
      sum += lp[t].get<double>();
    }
    scores[index].logprob = sum;
  }
  return scores;
}

Result<Generation> CompletionClient::Generate(const std::string& prompt,
                                              const std::vector<std::string>& stops,
                                              int max_tokens) {
  const int room = impl_->options.max_length + 1 - max_tokens;
  if (room < 1)
    return InvalidArgument(
        "--max-gen-toks {}: leaves no room for the prompt in {} tokens of context", max_tokens,
        impl_->options.max_length + 1);
  auto ids = impl_->Tokenize(prompt);
  if (!ids.ok()) return ids.status();
  Generation g;
  if (ids->size() > static_cast<size_t>(room)) {
    ids->erase(ids->begin(), ids->end() - room);
    g.truncated = true;
  }
  g.prompt_tokens = static_cast<int>(ids->size());
  Json body = {{"model", impl_->options.model},
               {"prompt", *ids},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"stop", stops},
               {"seed", impl_->options.seed}};
  auto r = impl_->Post("/v1/completions", body);
  if (!r.ok()) return r.status();
  if (!r->contains("choices") || !(*r)["choices"].is_array() || (*r)["choices"].empty() ||
      !(*r)["choices"][0].contains("text") || !(*r)["choices"][0]["text"].is_string())
    return Internal("POST /v1/completions: expected choices[0].text");
  g.text = (*r)["choices"][0]["text"].get<std::string>();
  // Servers stop at the sequences already; cutting again keeps a server that does not honest.
  for (const std::string& s : stops) {
    const size_t p = g.text.find(s);
    if (p != std::string::npos) g.text.resize(p);
  }
  return g;
}

}  // namespace dh::tools
