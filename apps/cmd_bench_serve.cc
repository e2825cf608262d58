// `deepharness bench` (the host of the benchmark subcommands, see bench_commands.h) and
// `deepharness bench serve`: the mixed-traffic load generator against a running server.
#include <cmath>
#include <cstdio>
#include <limits>

#include "apps/bench_commands.h"
#include "apps/command.h"
#include "apps/model_options.h"
#include "tools/bench_serve.h"
#include "tools/report_html.h"

namespace dh::app {

std::vector<CommandSpec>& BenchCommandRegistry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

namespace {

std::function<int()> SetupBench(CLI::App* bench) {
  auto chosen = std::make_shared<std::function<int()>>();
  std::function<int()> own_action;
  for (CommandSpec& spec : BenchCommandRegistry()) {
    if (spec.name.empty()) {
      own_action = spec.setup(bench);
      continue;
    }
    CLI::App* sub = bench->add_subcommand(spec.name, spec.description);
    auto run = spec.setup(sub);
    sub->callback([chosen, run] { *chosen = run; });
  }
  bench->require_subcommand(own_action ? 0 : 1, 1);
  return [chosen, own_action]() -> int {
    if (*chosen) return (*chosen)();
    if (own_action) return own_action();
    std::fprintf(stderr, "error: bench: name a benchmark (e.g. bench serve)\n");
    return kExitBadInput;
  };
}

DH_REGISTER_COMMAND(bench_command, "bench", "Benchmarks (bench serve: load-test a running server)",
                    SetupBench);

std::function<int()> SetupBenchServe(CLI::App* sub) {
  struct Args {
    tools::BenchServeOptions options;
    std::string mix = "short:20,medium:60,long:20";
    std::string request_rate = "inf";
    bool json = false;
    std::string output;
    std::string concurrency = "8";
    std::string report;
    std::vector<std::string> compare;
  };
  auto a = std::make_shared<Args>();
  tools::BenchServeOptions& o = a->options;
  sub->add_option("--url", o.url, "Server base URL (default http://127.0.0.1:8000)");
  sub->add_option("--model", o.model, "Model name to send (default: the server's first model)");
  sub->add_option("--api-key", o.api_key, "Bearer key (default: env DEEPHARNESS_API_KEY)");
  sub->add_option("--concurrency,--max-concurrency", a->concurrency,
                  "Requests in flight at once (default 8); a comma-separated list (1,4,16) runs "
                  "each level in turn");
  sub->add_option("--num-prompts", o.num_prompts, "Requests to send (default 100)");
  sub->add_option("--mix", a->mix,
                  "Prompt classes and weights (default short:20,medium:60,long:20); lengths scale "
                  "with the model's context: short 1/16 in + 1/16 out, medium 1/4 + 1/8, long "
                  "1/2 + 1/4 (capped at 32+32, 256+128, 1024+256 tokens)");
  sub->add_option("--request-rate", a->request_rate,
                  "Poisson arrival rate in req/s, or inf to send as fast as concurrency allows "
                  "(default inf)");
  sub->add_option("--duration", o.duration_s,
                  "Run for this many seconds instead of --num-prompts requests");
  sub->add_option("--seed", o.seed, "Seed for the prompt plan and arrivals (default 0)");
  sub->add_option("--temperature", o.temperature, "Sampling temperature (default 0: greedy)");
  sub->add_option("--timeout", o.timeout_s, "Per-request timeout in seconds (default 600)");
  sub->add_flag("--json", a->json, "Print the result as JSON (vllm bench serve keys)");
  sub->add_flag("--save-detailed", o.detailed, "Include every request in the JSON");
  sub->add_option("--result-file", a->output,
                  "Also write the JSON result to this file (an array with several levels)");
  sub->add_option("--report", a->report,
                  "Also write an HTML report with charts (throughput and latency per "
                  "concurrency level, latency CDFs) to this file");
  sub->add_option("--compare", a->compare,
                  "Do not run: write the --report of these saved JSON results side by side")
      ->expected(1, -1);
  return [a]() -> int {
    tools::BenchServeOptions& o = a->options;
    if (!a->compare.empty()) {
      if (a->report.empty()) {
        std::fprintf(stderr, "error: --compare: expected --report FILE.html to write\n");
        return kExitBadInput;
      }
      auto runs = tools::LoadReportRuns(a->compare);
      if (!runs.ok()) return ReportError(runs.status());
      Status st = tools::WriteReportFile(a->report, tools::BenchReportHtml(*runs, "Benchmark comparison"));
      if (!st.ok()) return ReportError(st);
      std::fprintf(stderr, "wrote %s (%zu results)\n", a->report.c_str(), runs->size());
      return kExitOk;
    }
    if (!a->report.empty()) {
      if (Status st = tools::CheckReportPath(a->report); !st.ok()) return ReportError(st);
    }
    auto levels = ParseIdList(a->concurrency, "--concurrency");
    if (!levels.ok()) return ReportError(levels.status());
    for (int32_t c : *levels) {
      if (c < 1 || c > 65536) {
        std::fprintf(stderr, "error: --concurrency: expected levels in [1, 65536], got %d\n", c);
        return kExitBadInput;
      }
    }
    auto mix = tools::ParseMix(a->mix);
    if (!mix.ok()) {
      std::fprintf(stderr, "error: %s\n", mix.status().message().c_str());
      return kExitBadInput;
    }
    o.mix = *mix;
    if (a->request_rate == "inf") {
      o.request_rate = std::numeric_limits<double>::infinity();
    } else {
      char* end = nullptr;
      o.request_rate = std::strtod(a->request_rate.c_str(), &end);
      if (*end != '\0' || !(o.request_rate > 0)) {
        std::fprintf(stderr, "error: --request-rate: expected a positive number or inf\n");
        return kExitBadInput;
      }
    }
    std::vector<std::string> jsons;
    std::vector<tools::ReportRun> runs;
    int failed = 0;
    for (int32_t level : *levels) {
      o.concurrency = level;
      auto result = tools::RunBenchServe(o);
      if (!result.ok()) {
        std::fprintf(stderr, "error: %s\n", result.status().message().c_str());
        return result.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : kExitFailure;
      }
      failed += result->failed;
      jsons.push_back(tools::FormatJson(*result, o));
      if (!a->json) std::fputs(tools::FormatTable(*result, o).c_str(), stdout);
      if (!a->report.empty()) {
        auto j = nlohmann::json::parse(jsons.back());
        if (!j.contains("itls")) {  // the pooled ITL CDF, also without --save-detailed
          nlohmann::json itls = nlohmann::json::array();
          for (const tools::RequestResult& q : result->requests)
            if (q.success) itls.push_back(q.itl);
          j["itls"] = std::move(itls);
        }
        runs.push_back({result->model, std::move(j)});
      }
    }
    std::string json = jsons.front();
    if (jsons.size() > 1) {
      json = "[\n";
      for (size_t i = 0; i < jsons.size(); ++i) json += jsons[i] + (i + 1 < jsons.size() ? ",\n" : "\n");
      json += "]";
    }
    if (!a->report.empty()) {
      Status st = tools::WriteReportFile(a->report, tools::BenchReportHtml(runs, "bench serve"));
      if (!st.ok()) return ReportError(st);
    }
    if (!a->output.empty()) {
      FILE* f = std::fopen(a->output.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "error: --result-file: cannot write %s\n", a->output.c_str());
        return kExitFailure;
      }
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
    if (a->json) std::fputs((json + "\n").c_str(), stdout);
    return failed == 0 ? kExitOk : kExitFailure;
  };
}

DH_REGISTER_BENCH_COMMAND(bench_serve_command, "serve",
                          "Load-test an OpenAI-compatible server (TTFT, TPOT, ITL, E2E, "
                          "throughput; vllm bench serve definitions)",
                          SetupBenchServe);

}  // namespace
}  // namespace dh::app
