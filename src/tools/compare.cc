// compare.h: the prompts file, target specs, the HTTP client and the run over all prompts.
#include "tools/compare.h"

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/progress.h"
#include "tools/http_target.h"

namespace dh::tools {
namespace {

using Json = nlohmann::json;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r' || s.back() == '\t')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  return s.substr(i);
}

bool IsInt(const std::string& s) {
  return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
}

double NumberOr(const Json& j, double fallback) {
  return j.is_number() ? j.get<double>() : fallback;
}

// choices[0] of /v1/completions: text + logprobs {tokens, token_logprobs, top_logprobs[{tok: lp}]}.
Result<CompareCompletion> ParseCompletion(const Json& choice) {
  CompareCompletion c;
  if (!choice.contains("text") || !choice["text"].is_string())
    return Internal("expected choices[0].text to be a string");
  c.text = choice["text"].get<std::string>();
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    c.finish_reason = choice["finish_reason"].get<std::string>();
  const Json* lp = choice.contains("logprobs") ? &choice["logprobs"] : nullptr;
  if (lp == nullptr || !lp->is_object() || !lp->contains("tokens") || !(*lp)["tokens"].is_array())
    return c;
  const Json& tokens = (*lp)["tokens"];
  const Json& values = lp->value("token_logprobs", Json::array());
  const Json& tops = lp->value("top_logprobs", Json::array());
  c.has_tokens = true;
  for (size_t i = 0; i < tokens.size(); ++i) {
    CompareToken t;
    if (!tokens[i].is_string()) return Internal("logprobs.tokens[{}] is not a string", i);
    t.token = tokens[i].get<std::string>();
    if (values.is_array() && i < values.size()) t.logprob = NumberOr(values[i], t.logprob);
    if (tops.is_array() && i < tops.size() && tops[i].is_object()) {
      for (const auto& [tok, v] : tops[i].items()) t.top.push_back({tok, NumberOr(v, -1e30)});
      std::stable_sort(t.top.begin(), t.top.end(),
                       [](const auto& x, const auto& y) { return x.second > y.second; });
    }
    c.tokens.push_back(std::move(t));
  }
  return c;
}

// choices[0] of /v1/chat/completions: message.content + logprobs.content[{token, logprob,
// top_logprobs[{token, logprob}]}]. Reasoning text (reasoning_content) is prepended, since the
// tokens cover it too.
Result<CompareCompletion> ParseChat(const Json& choice) {
  CompareCompletion c;
  if (!choice.contains("message") || !choice["message"].is_object())
    return Internal("expected choices[0].message to be an object");
  const Json& msg = choice["message"];
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string())
    c.text = msg["reasoning_content"].get<std::string>();
  if (msg.contains("content") && msg["content"].is_string())
    c.text += msg["content"].get<std::string>();
  if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
    c.finish_reason = choice["finish_reason"].get<std::string>();
  const Json* lp = choice.contains("logprobs") ? &choice["logprobs"] : nullptr;
  if (lp == nullptr || !lp->is_object() || !lp->contains("content") ||
      !(*lp)["content"].is_array())
    return c;
  c.has_tokens = true;
  for (const Json& e : (*lp)["content"]) {
    CompareToken t;
    if (!e.is_object() || !e.contains("token") || !e["token"].is_string())
      return Internal("logprobs.content[] entry without a string 'token'");
    t.token = e["token"].get<std::string>();
    t.logprob = NumberOr(e.value("logprob", Json()), t.logprob);
    if (e.contains("top_logprobs") && e["top_logprobs"].is_array()) {
      for (const Json& alt : e["top_logprobs"]) {
        if (alt.is_object() && alt.contains("token") && alt["token"].is_string())
          t.top.push_back({alt["token"].get<std::string>(),
                           NumberOr(alt.value("logprob", Json()), -1e30)});
      }
    }
    c.tokens.push_back(std::move(t));
  }
  return c;
}

class Client {
 public:
  Client(const HttpTarget& target, std::string model, const CompareOptions& o)
      : prefix_(target.prefix), model_(std::move(model)), http_(target.base) {
    http_.set_keep_alive(true);
    http_.set_tcp_nodelay(true);
    http_.set_read_timeout(o.timeout_s, 0);
    http_.set_write_timeout(o.timeout_s, 0);
    http_.set_connection_timeout(10, 0);
    if (!o.api_key.empty()) http_.set_bearer_token_auth(o.api_key);
  }

  Result<CompareCompletion> Run(const ComparePrompt& p, const CompareOptions& o, bool greedy,
                                uint64_t seed) {
    Json body = {{"model", model_}, {"max_tokens", o.max_tokens}, {"seed", seed}};
    if (greedy) {
      body["temperature"] = 0;
    } else {
      body["temperature"] = o.temperature;
      body["top_p"] = o.top_p;
    }
    std::string path;
    if (p.chat) {
      path = "/v1/chat/completions";
      body["messages"] = p.messages;
      body["logprobs"] = true;
      body["top_logprobs"] = o.top_logprobs;
    } else {
      path = "/v1/completions";
      body["prompt"] = p.prompt;
      body["logprobs"] = o.top_logprobs;
    }
    const std::string text = body.dump(-1, ' ', false, Json::error_handler_t::replace);
    auto res = http_.Post(prefix_ + path, text, "application/json");
    if (!res) return IoError("POST {}: {}", path, httplib::to_string(res.error()));
    if (res->status != 200)
      return IoError("POST {}: HTTP {}: {}", path, res->status, ServerErrorMessage(res->body));
    Json j = Json::parse(res->body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("choices") || !j["choices"].is_array() ||
        j["choices"].empty() || !j["choices"][0].is_object())
      return Internal("POST {}: expected a JSON object with a non-empty 'choices' list", path);
    auto c = p.chat ? ParseChat(j["choices"][0]) : ParseCompletion(j["choices"][0]);
    if (!c.ok()) return c.status().WithContext("POST " + path);
    return c;
  }

 private:
  std::string prefix_, model_;
  httplib::Client http_;
};

// GET /v1/models: the endpoint's model (the named one must be listed; else the first).
Result<std::string> ResolveModel(const CompareEndpoint& e, const CompareOptions& o) {
  DH_ASSIGN_OR_RETURN(HttpTarget t, ParseHttpTarget(e.url, "--" + e.label, " or model=DIR,..."));
  httplib::Client http(t.base);
  http.set_connection_timeout(10, 0);
  http.set_read_timeout(60, 0);
  httplib::Headers headers;
  if (!o.api_key.empty()) headers.emplace("Authorization", "Bearer " + o.api_key);
  auto res = http.Get(t.prefix + "/v1/models", headers);
  if (!res)
    return IoError("--{} {}: GET /v1/models: {} (is the server running?)", e.label, e.url,
                   httplib::to_string(res.error()));
  if (res->status != 200)
    return IoError("--{} {}: GET /v1/models: HTTP {}: {}", e.label, e.url, res->status,
                   ServerErrorMessage(res->body));
  Json j = Json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty())
    return IoError("--{} {}: GET /v1/models: expected a non-empty 'data' list", e.label, e.url);
  if (e.model.empty()) return j["data"][0].value("id", std::string());
  for (const Json& m : j["data"])
    if (m.is_object() && m.value("id", std::string()) == e.model) return e.model;
  return InvalidArgument("--{} {}: name={}: the server does not serve this model", e.label, e.url,
                         e.model);
}

}  // namespace

Result<std::vector<ComparePrompt>> ReadComparePrompts(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("{}: cannot read the prompts file", path);
  std::vector<ComparePrompt> prompts;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (Trim(line).empty()) continue;
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded())
      return InvalidArgument("{}:{}: not valid JSON (expected one JSON object per line)", path, n);
    const bool has_prompt = j.is_object() && j.contains("prompt");
    const bool has_messages = j.is_object() && j.contains("messages");
    if (has_prompt == has_messages)
      return InvalidArgument(
          "{}:{}: expected an object with either \"prompt\" (a string) or \"messages\" (an "
          "array)",
          path, n);
    ComparePrompt p;
    p.line = n;
    p.id = "line " + std::to_string(n);
    if (j.contains("id")) {
      if (j["id"].is_string()) {
        p.id = j["id"].get<std::string>();
      } else if (j["id"].is_number_integer()) {
        p.id = std::to_string(j["id"].get<int64_t>());
      } else {
        return InvalidArgument("{}:{}: \"id\": expected a string or an integer", path, n);
      }
    }
    if (has_prompt) {
      if (!j["prompt"].is_string() || j["prompt"].get<std::string>().empty())
        return InvalidArgument("{}:{}: \"prompt\": expected a non-empty string", path, n);
      p.prompt = j["prompt"].get<std::string>();
    } else {
      const Json& m = j["messages"];
      if (!m.is_array() || m.empty())
        return InvalidArgument("{}:{}: \"messages\": expected a non-empty array", path, n);
      for (size_t i = 0; i < m.size(); ++i) {
        if (!m[i].is_object() || !m[i].contains("role") || !m[i]["role"].is_string())
          return InvalidArgument("{}:{}: \"messages\"[{}]: expected an object with a string "
                                 "\"role\"",
                                 path, n, i);
      }
      p.chat = true;
      p.messages = m;
    }
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) return InvalidArgument("{}: no prompts (expected JSON lines)", path);
  return prompts;
}

Result<CompareTargetSpec> ParseCompareTarget(const std::string& text, const std::string& flag) {
  CompareTargetSpec s;
  s.text = text;
  if (text.empty()) return InvalidArgument("{}: expected a URL or model=DIR,...", flag);
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    parts.push_back(Trim(text.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  size_t first_key = 0;
  if (parts[0].rfind("http", 0) == 0 && parts[0].find('=') == std::string::npos) {
    DH_RETURN_IF_ERROR(ParseHttpTarget(parts[0], flag, " or model=DIR,...").status());
    s.url = parts[0];
    first_key = 1;
  } else {
    s.local = true;
  }
  for (size_t i = first_key; i < parts.size(); ++i) {
    const std::string& kv = parts[i];
    const size_t eq = kv.find('=');
    if (s.local && i == 0 && eq == std::string::npos)
      return InvalidArgument("{}: '{}': expected an http:// URL or a spec with model=DIR", flag,
                             text);
    if (eq == std::string::npos || eq == 0)
      return InvalidArgument("{}: '{}': expected KEY=VALUE", flag, kv);
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (value.empty()) return InvalidArgument("{}: {}: expected a value", flag, key);
    if (!s.local) {
      if (key != "name")
        return InvalidArgument("{}: '{}': a URL target takes only name=SERVED_MODEL", flag, key);
      s.model_name = value;
      continue;
    }
    if (key == "model") {
      s.model_path = value;
    } else if (key == "device") {
      s.device = value;
    } else if (key == "dtype") {
      s.dtype = value;
    } else if (key == "quant") {
      s.quant = value;
    } else if (key == "tp" || key == "threads") {
      if (!IsInt(value))
        return InvalidArgument("{}: {}={}: expected a non-negative integer", flag, key, value);
      (key == "tp" ? s.tp : s.threads) = std::stoi(value);
    } else {
      return InvalidArgument(
          "{}: '{}': unknown key (expected model, device, dtype, quant, tp, threads)", flag, key);
    }
  }
  if (s.local && s.model_path.empty())
    return InvalidArgument("{}: '{}': expected an http:// URL or a spec with model=DIR", flag,
                           text);
  if (s.local && (s.tp < 1 || s.tp > 64))
    return InvalidArgument("{}: tp={}: expected 1 to 64 ranks", flag, s.tp);
  return s;
}

Status CheckCompareOptions(const CompareOptions& o) {
  if (o.max_tokens < 1 || o.max_tokens > 1 << 20)
    return InvalidArgument("--max-tokens: expected 1 to 1048576, got {}", o.max_tokens);
  if (o.top_logprobs < 1 || o.top_logprobs > 20)
    return InvalidArgument("--top-logprobs: expected 1 to 20, got {}", o.top_logprobs);
  if (o.samples < 0 || o.samples > 1000)
    return InvalidArgument("--samples: expected 0 to 1000, got {}", o.samples);
  if (!(o.temperature > 0 && o.temperature <= 2))
    return InvalidArgument("--temperature: expected (0, 2], got {}", o.temperature);
  if (!(o.top_p > 0 && o.top_p <= 1))
    return InvalidArgument("--top-p: expected (0, 1], got {}", o.top_p);
  if (o.concurrency < 1 || o.concurrency > 256)
    return InvalidArgument("--concurrency: expected 1 to 256, got {}", o.concurrency);
  if (o.timeout_s < 1) return InvalidArgument("--timeout: expected >= 1, got {}", o.timeout_s);
  return Status::Ok();
}

Result<CompareResult> RunCompare(const std::vector<ComparePrompt>& prompts, CompareEndpoint a,
                                 CompareEndpoint b, const CompareOptions& o) {
  DH_RETURN_IF_ERROR(CheckCompareOptions(o));
  DH_ASSIGN_OR_RETURN(a.model, ResolveModel(a, o));
  DH_ASSIGN_OR_RETURN(b.model, ResolveModel(b, o));
  DH_ASSIGN_OR_RETURN(HttpTarget ta, ParseHttpTarget(a.url, "--a", " or model=DIR,..."));
  DH_ASSIGN_OR_RETURN(HttpTarget tb, ParseHttpTarget(b.url, "--b", " or model=DIR,..."));
  CompareResult result;
  result.model_a = a.model;
  result.model_b = b.model;
  result.prompts.resize(prompts.size());
  const int runs_per_prompt = 1 + o.samples;
  const size_t jobs = prompts.size() * static_cast<size_t>(runs_per_prompt);
  for (size_t i = 0; i < prompts.size(); ++i) {
    result.prompts[i].prompt = &prompts[i];
    result.prompts[i].runs.resize(runs_per_prompt);
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status failure;
  size_t done = 0;
  ProgressBar bar("compare", jobs, o.progress);
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    Client ca(ta, a.model, o), cb(tb, b.model, o);
    while (true) {
      const size_t job = next.fetch_add(1);
      if (job >= jobs) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure.ok()) return;
      }
      const size_t pi = job / runs_per_prompt;
      const int ri = static_cast<int>(job % runs_per_prompt);
      const ComparePrompt& p = prompts[pi];
      CompareRun& run = result.prompts[pi].runs[ri];
      const bool greedy = ri == 0;
      run.mode = greedy ? "greedy" : "sampled";
      run.seed = greedy ? o.seed : o.seed + static_cast<uint64_t>(ri - 1);
      auto ra = ca.Run(p, o, greedy, run.seed);
      Result<CompareCompletion> rb =
          ra.ok() ? cb.Run(p, o, greedy, run.seed) : Result<CompareCompletion>(ra.status());
      std::lock_guard<std::mutex> lock(mu);
      if (!ra.ok() || !rb.ok()) {
        if (failure.ok()) {
          const std::string which = !ra.ok() ? "--a " + a.url : "--b " + b.url;
          failure = (!ra.ok() ? ra.status() : rb.status())
                        .WithContext(fmt::format("{}: prompt '{}' (line {})", which, p.id, p.line));
        }
        return;
      }
      run.a = std::move(*ra);
      run.b = std::move(*rb);
      run.metrics = ComparePair(run.a, run.b);
      bar.Update(++done);
    }
  };
  std::vector<std::thread> threads;
  const int n = static_cast<int>(std::min<size_t>(o.concurrency, jobs));
  for (int i = 1; i < n; ++i) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  bar.Finish();
  if (!failure.ok()) return failure;
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<PairMetrics> greedy, sampled;
  for (const ComparePromptResult& pr : result.prompts) {
    for (const CompareRun& r : pr.runs) (r.mode == "greedy" ? greedy : sampled).push_back(r.metrics);
  }
  result.greedy = Summarize(greedy);
  result.sampled = Summarize(sampled);
  return result;
}

}  // namespace dh::tools
