// The bench serve client: worker threads (one keep-alive connection each) stream completions
// and time every SSE event; results are summarized like vllm bench serve.
#include "tools/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "base/stats.h"
#include "tools/http_target.h"

namespace dh::tools {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Text tokenized once to give prompts natural token ids (public-domain Shakespeare).
constexpr const char kCorpus[] =
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate: Rough "
    "winds do shake the darling buds of May, And summer's lease hath all too short a date; "
    "Sometime too hot the eye of heaven shines, And often is his gold complexion dimm'd; And "
    "every fair from fair sometime declines, By chance or nature's changing course untrimm'd; "
    "But thy eternal summer shall not fade, Nor lose possession of that fair thou ow'st; Nor "
    "shall death brag thou wander'st in his shade, When in eternal lines to time thou grow'st: "
    "So long as men can breathe or eyes can see, So long lives this, and this gives life to "
    "thee. To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles And "
    "by opposing end them. To die: to sleep; No more; and by a sleep to say we end The "
    "heart-ache and the thousand natural shocks That flesh is heir to. Friends, Romans, "
    "countrymen, lend me your ears; I come to bury Caesar, not to praise him.";

httplib::Headers AuthHeaders(const std::string& key) {
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  return h;
}

// Parses SSE `data:` lines as they arrive and timestamps the ones that carry text.
class SseParser {
 public:
  SseParser(RequestResult* r, Clock::time_point start) : r_(r), start_(start) {}

  void Feed(const char* data, size_t n) {
    buffer_.append(data, n);
    size_t pos;
    while ((pos = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, pos);
      buffer_.erase(0, pos + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      OnLine(line);
    }
  }
  bool done() const { return done_; }
  const std::string& raw() const { return raw_; }

 private:
  void OnLine(const std::string& line) {
    if (raw_.size() < 4096) raw_ += line + "\n";
    if (line.rfind("data: ", 0) != 0) return;
    std::string payload = line.substr(6);
    if (payload == "[DONE]") {
      done_ = true;
      return;
    }
    Json j = Json::parse(payload, nullptr, false);
    if (j.is_discarded()) {
      r_->error = "unparseable SSE event";
      return;
    }
    if (j.contains("error")) {
      r_->error = j["error"].value("message", "error event");
      return;
    }
    const double now = std::chrono::duration<double>(Clock::now() - start_).count();
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      const Json& c = j["choices"][0];
      std::string text;
      if (c.contains("text") && c["text"].is_string()) text = c["text"];
      if (c.contains("delta") && c["delta"].is_object()) {
        const Json& d = c["delta"];
        if (d.contains("content") && d["content"].is_string()) text += d["content"].get<std::string>();
        if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
          text += d["reasoning_content"].get<std::string>();
      }
      // Only chunks that carry text count as tokens (the empty finish chunk is not a token).
      if (!text.empty()) {
        if (!first_) {
          first_ = true;
          r_->ttft = now;
        } else {
          r_->itl.push_back(now - last_);
        }
        last_ = now;
        r_->text += text;
      }
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      r_->output_tokens = j["usage"].value("completion_tokens", int64_t{0});
      r_->input_tokens = j["usage"].value("prompt_tokens", r_->input_tokens);
    }
  }

  RequestResult* r_;
  Clock::time_point start_;
  std::string buffer_;
  std::string raw_;
  bool first_ = false;
  bool done_ = false;
  double last_ = 0;
};

struct PlannedRequest {
  int class_index = 0;
  std::vector<int32_t> prompt;
};

// The whole story of a failed connection ("Connection" alone says little).
std::string ConnectionErrorText(httplib::Error error, const std::string& url) {
  std::string what;
  switch (error) {
    case httplib::Error::Connection:
      what = "could not connect (refused, unreachable or timed out)";
      break;
    case httplib::Error::Read:
      what = "the connection failed or was closed while reading the response";
      break;
    case httplib::Error::Write:
      what = "the connection failed or was closed while sending the request";
      break;
    case httplib::Error::BindIPAddress:
      what = "could not bind the local address";
      break;
    case httplib::Error::Canceled:
      what = "the request was cancelled";
      break;
    default:
      what = "request failed";
      break;
  }
  return fmt::format("connection error to {}: {} (httplib error {})", url, what,
                     httplib::to_string(error));
}

RequestResult SendOne(httplib::Client& client, const std::string& path,
                      const BenchServeOptions& o, const std::string& model,
                      const PromptClass& cls, const PlannedRequest& plan) {
  RequestResult r;
  r.prompt_class = cls.name;
  r.input_tokens = static_cast<int64_t>(plan.prompt.size());
  Json body = {{"model", model},
               {"prompt", plan.prompt},
               {"max_tokens", cls.output_tokens},
               {"temperature", o.temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}},
               {"ignore_eos", o.ignore_eos}};
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = AuthHeaders(o.api_key);
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  const auto start = Clock::now();
  SseParser parser(&r, start);
  req.content_receiver = [&parser](const char* data, size_t n, uint64_t, uint64_t) {
    parser.Feed(data, n);
    return true;
  };
  auto res = client.send(req);
  r.latency = std::chrono::duration<double>(Clock::now() - start).count();
  if (!res) {
    r.status = 0;
    r.error = ConnectionErrorText(res.error(), o.url);
    return r;
  }
  r.status = res->status;
  if (res->status != 200) {
    Json err = Json::parse(parser.raw(), nullptr, false);
    r.error = fmt::format("HTTP {}", res->status);
    if (!err.is_discarded() && err.contains("error")) r.error += ": " + err["error"].value("message", "");
    return r;
  }
  if (!parser.done() && r.error.empty()) r.error = "stream ended without [DONE]";
  r.success = r.error.empty();
  return r;
}

}  // namespace

Result<std::vector<std::pair<std::string, int>>> ParseMix(const std::string& text) {
  std::vector<std::pair<std::string, int>> mix;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(i, end - i);
    size_t colon = item.find(':');
    if (colon == std::string::npos)
      return InvalidArgument("--mix: '{}' is not NAME:WEIGHT (e.g. short:20,medium:60,long:20)", item);
    std::string name = item.substr(0, colon);
    std::string weight = item.substr(colon + 1);
    if (name != "short" && name != "medium" && name != "long")
      return InvalidArgument("--mix: unknown class '{}' (expected short, medium or long)", name);
    if (weight.empty() || weight.size() > 6 || weight.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument("--mix: weight of '{}' must be a non-negative integer", name);
    mix.emplace_back(name, std::stoi(weight));
    i = end + 1;
  }
  int total = 0;
  for (const auto& [name, w] : mix) total += w;
  if (total <= 0) return InvalidArgument("--mix: the weights must not all be 0");
  return mix;
}

std::vector<PromptClass> ScaledClasses(int max_model_len) {
  auto clamp = [&](int want, int cap) { return std::max(1, std::min(want, cap)); };
  const int m = std::max(8, max_model_len);
  return {{"short", clamp(m / 16, 32), clamp(m / 16, 32)},
          {"medium", clamp(m / 4, 256), clamp(m / 8, 128)},
          {"long", clamp(m / 2, 1024), clamp(m / 4, 256)}};
}

LatencyStats ComputeStats(std::vector<double> seconds) {
  LatencyStats s;
  if (seconds.empty()) return s;
  std::sort(seconds.begin(), seconds.end());
  double sum = 0;
  for (double v : seconds) sum += v;
  const double mean = sum / static_cast<double>(seconds.size());
  double var = 0;
  for (double v : seconds) var += (v - mean) * (v - mean);
  var /= static_cast<double>(seconds.size());
  s.mean = mean * 1000;
  s.median = Percentile(seconds, 50) * 1000;
  s.std = std::sqrt(var) * 1000;
  s.p99 = Percentile(seconds, 99) * 1000;
  return s;
}

Result<BenchServeResult> RunBenchServe(const BenchServeOptions& o_in) {
  BenchServeOptions o = o_in;
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("DEEPHARNESS_API_KEY")) o.api_key = env;
  }
  if (o.concurrency < 1) return InvalidArgument("--concurrency: expected >= 1, got {}", o.concurrency);
  if (o.num_prompts < 1 && o.duration_s <= 0)
    return InvalidArgument("--num-prompts: expected >= 1, got {}", o.num_prompts);
  if (!(o.request_rate > 0)) return InvalidArgument("--request-rate: expected > 0 (or inf)");
  DH_ASSIGN_OR_RETURN(HttpTarget target, ParseHttpTarget(o.url, "--url"));

  BenchServeResult result;
  {
    httplib::Client probe(target.base);
    probe.set_connection_timeout(10);
    probe.set_read_timeout(30);
    auto res = probe.Get((target.prefix + "/v1/models").c_str(), AuthHeaders(o.api_key));
    if (!res) return IoError("cannot reach {}: {}", o.url, ConnectionErrorText(res.error(), o.url));
    if (res->status != 200) return IoError("GET /v1/models on {} answered HTTP {}", o.url, res->status);
    Json models = Json::parse(res->body, nullptr, false);
    if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
        models["data"].empty())
      return IoError("GET /v1/models on {} returned no models", o.url);
    const Json& first = models["data"][0];
    result.model = o.model.empty() ? first.value("id", std::string()) : o.model;
    result.max_model_len = first.value("max_model_len", 2048);
  }
  result.classes = ScaledClasses(result.max_model_len);

  // Natural token ids from /tokenize; random ids when the server has no such route.
  std::vector<int32_t> pool;
  {
    httplib::Client client(target.base);
    Json body = {{"model", result.model}, {"prompt", kCorpus}, {"add_special_tokens", false}};
    auto res = client.Post((target.prefix + "/tokenize").c_str(), AuthHeaders(o.api_key),
                           body.dump(), "application/json");
    if (res && res->status == 200) {
      Json j = Json::parse(res->body, nullptr, false);
      if (!j.is_discarded() && j.contains("tokens")) pool = j["tokens"].get<std::vector<int32_t>>();
    }
  }
  std::mt19937_64 rng(o.seed);
  if (pool.empty()) {
    std::uniform_int_distribution<int32_t> id(100, 999);
    for (int i = 0; i < 4096; ++i) pool.push_back(id(rng));
  }

  // Plan the requests (in duration mode the plan repeats).
  std::vector<int> class_of;
  for (const auto& [name, w] : o.mix) {
    for (size_t c = 0; c < result.classes.size(); ++c)
      if (result.classes[c].name == name) class_of.insert(class_of.end(), w, static_cast<int>(c));
  }
  const int planned = o.duration_s > 0 ? std::max(o.num_prompts, 1000) : o.num_prompts;
  std::vector<PlannedRequest> plan(planned);
  std::uniform_int_distribution<size_t> pick(0, class_of.size() - 1);
  for (PlannedRequest& p : plan) {
    p.class_index = class_of[pick(rng)];
    const int len = result.classes[p.class_index].input_tokens;
    std::uniform_int_distribution<size_t> start(0, pool.size() - 1);
    size_t s = start(rng);
    for (int i = 0; i < len; ++i) p.prompt.push_back(pool[(s + i) % pool.size()]);
  }
  std::vector<double> arrival(planned, 0.0);
  if (std::isfinite(o.request_rate)) {
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (double& a : arrival) {
      a = t;
      t += gap(rng);
    }
  }

  std::atomic<int> next{0};
  std::mutex mu;
  const std::string path = target.prefix + "/v1/completions";
  const auto bench_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - bench_start).count(); };
  std::vector<std::thread> workers;
  for (int w = 0; w < o.concurrency; ++w) {
    workers.emplace_back([&] {
      httplib::Client client(target.base);
      client.set_connection_timeout(30);
      client.set_read_timeout(o.timeout_s);
      client.set_write_timeout(30);
      client.set_keep_alive(true);
      while (true) {
        int i = next.fetch_add(1);
        if (o.duration_s > 0) {
          if (elapsed() >= o.duration_s) return;
        } else if (i >= planned) {
          return;
        }
        const int slot = i % planned;
        if (o.duration_s <= 0 && arrival[slot] > elapsed())
          std::this_thread::sleep_for(std::chrono::duration<double>(arrival[slot] - elapsed()));
        const PlannedRequest& p = plan[slot];
        RequestResult r = SendOne(client, path, o, result.model, result.classes[p.class_index], p);
        r.index = i;
        std::lock_guard<std::mutex> lock(mu);
        result.requests.push_back(std::move(r));
      }
    });
  }
  for (std::thread& t : workers) t.join();
  result.duration_s = elapsed();
  std::sort(result.requests.begin(), result.requests.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.index < b.index; });

  std::vector<double> ttfts, tpots, itls, e2els;
  for (const RequestResult& r : result.requests) {
    ++result.status_counts[r.status];
    if (!r.success) {
      ++result.failed;
      if (result.sample_errors.size() < 5) result.sample_errors.push_back(r.error);
      continue;
    }
    ++result.completed;
    result.total_input_tokens += r.input_tokens;
    result.total_output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft);
    if (r.output_tokens > 1) tpots.push_back((r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1));
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
    e2els.push_back(r.latency);
  }
  result.num_requests = static_cast<int>(result.requests.size());
  const double d = std::max(result.duration_s, 1e-9);
  result.request_throughput = result.completed / d;
  result.output_throughput = static_cast<double>(result.total_output_tokens) / d;
  result.total_token_throughput =
      static_cast<double>(result.total_input_tokens + result.total_output_tokens) / d;
  result.error_rate = result.num_requests ? static_cast<double>(result.failed) / result.num_requests : 0;
  result.ttft = ComputeStats(ttfts);
  result.tpot = ComputeStats(tpots);
  result.itl = ComputeStats(itls);
  result.e2el = ComputeStats(e2els);
  return result;
}

std::string FormatTable(const BenchServeResult& r, const BenchServeOptions& o) {
  std::string out;
  auto line = [&](const std::string& label, const std::string& value) {
    out += fmt::format("{:<40}{:<10}\n", label, value);
  };
  auto section = [&](const std::string& title) {
    const int pad = std::max(0, 50 - static_cast<int>(title.size()));
    out += std::string(pad / 2, '-') + title + std::string(pad - pad / 2, '-') + "\n";
  };
  out += "============ Serving Benchmark Result ============\n";
  line("Successful requests:", std::to_string(r.completed));
  line("Failed requests:", std::to_string(r.failed));
  line("Error rate (%):", fmt::format("{:.2f}", r.error_rate * 100));
  line("Maximum request concurrency:", std::to_string(o.concurrency));
  line("Benchmark duration (s):", fmt::format("{:.2f}", r.duration_s));
  line("Total input tokens:", std::to_string(r.total_input_tokens));
  line("Total generated tokens:", std::to_string(r.total_output_tokens));
  line("Request throughput (req/s):", fmt::format("{:.2f}", r.request_throughput));
  line("Output token throughput (tok/s):", fmt::format("{:.2f}", r.output_throughput));
  line("Total Token throughput (tok/s):", fmt::format("{:.2f}", r.total_token_throughput));
  auto stats = [&](const char* title, const char* key, const LatencyStats& s) {
    section(title);
    line(fmt::format("Mean {} (ms):", key), fmt::format("{:.2f}", s.mean));
    line(fmt::format("Median {} (ms):", key), fmt::format("{:.2f}", s.median));
    line(fmt::format("P99 {} (ms):", key), fmt::format("{:.2f}", s.p99));
  };
  stats("Time to First Token", "TTFT", r.ttft);
  stats("Time per Output Token (excl. 1st token)", "TPOT", r.tpot);
  stats("Inter-token Latency", "ITL", r.itl);
  stats("End-to-end Latency", "E2EL", r.e2el);
  out += "==================================================\n";
  for (const std::string& e : r.sample_errors) out += "error: " + e + "\n";
  return out;
}

std::string FormatJson(const BenchServeResult& r, const BenchServeOptions& o) {
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y%m%d-%H%M%S", std::gmtime(&now));
  Json classes = Json::array();
  for (const PromptClass& c : r.classes)
    classes.push_back({{"name", c.name}, {"input_tokens", c.input_tokens}, {"output_tokens", c.output_tokens}});
  Json status = Json::object();
  for (const auto& [code, n] : r.status_counts) status[std::to_string(code)] = n;
  Json j = {{"date", date},
            {"backend", "openai"},
            {"model_id", r.model},
            {"num_prompts", r.num_requests},
            {"request_rate", std::isfinite(o.request_rate) ? Json(o.request_rate) : Json("inf")},
            {"max_concurrency", o.concurrency},
            {"duration", r.duration_s},
            {"completed", r.completed},
            {"failed", r.failed},
            {"error_rate", r.error_rate},
            {"status_counts", status},
            {"errors", r.sample_errors},
            {"prompt_classes", classes},
            {"total_input_tokens", r.total_input_tokens},
            {"total_output_tokens", r.total_output_tokens},
            {"request_throughput", r.request_throughput},
            {"output_throughput", r.output_throughput},
            {"total_token_throughput", r.total_token_throughput}};
  auto put = [&](const char* key, const LatencyStats& s) {
    j[fmt::format("mean_{}_ms", key)] = s.mean;
    j[fmt::format("median_{}_ms", key)] = s.median;
    j[fmt::format("std_{}_ms", key)] = s.std;
    j[fmt::format("p99_{}_ms", key)] = s.p99;
  };
  put("ttft", r.ttft);
  put("tpot", r.tpot);
  put("itl", r.itl);
  put("e2el", r.e2el);
  // Per-request samples of the successful requests (seconds, plan order; vllm's key names): the
  // latency distributions of `--report`. The pooled ITL gaps are larger, so only with detail.
  Json ttfts = Json::array(), e2els = Json::array(), itls = Json::array();
  for (const RequestResult& q : r.requests) {
    if (!q.success) continue;
    ttfts.push_back(q.ttft);
    e2els.push_back(q.latency);
    if (o.detailed) itls.push_back(q.itl);
  }
  j["ttfts"] = std::move(ttfts);
  j["e2els"] = std::move(e2els);
  if (o.detailed) j["itls"] = std::move(itls);
  if (o.detailed) {
    Json details = Json::array();
    for (const RequestResult& q : r.requests) {
      details.push_back({{"index", q.index},
                         {"class", q.prompt_class},
                         {"success", q.success},
                         {"status", q.status},
                         {"input_tokens", q.input_tokens},
                         {"output_tokens", q.output_tokens},
                         {"generated_text", q.text}});
    }
    j["requests"] = std::move(details);
  }
  return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace dh::tools
