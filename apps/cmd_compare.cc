// `deepharness compare --a TARGET --b TARGET --prompts FILE`: do two deployments answer alike?
// A TARGET is an OpenAI-compatible URL or a local model spec (model=DIR,device=cpu,quant=int4,
// tp=N), which is served on a private loopback port so both kinds are measured through the same
// client (src/tools/compare.h): loaded in this process with tp=1, by a child `serve` process
// (which starts its own mpirun job) with tp > 1. Exit 0: every threshold passed; 1: one failed;
// 2: could not run (bad flags, prompts file, target, or an unreachable server).
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "apps/child_server.h"
#include "apps/command.h"
#include "apps/in_process_server.h"
#include "apps/model_options.h"
#include "base/log.h"
#include "tools/compare.h"
#include "tools/compare_report.h"

namespace dh::app {
namespace {

struct CompareArgs {
  std::string a, b, prompts, json_file, markdown;
  bool json = false;
  bool quiet = false;
  tools::CompareOptions options;
  tools::CompareThresholds thresholds;
  // Command-line values of the thresholds (NaN: not given).
  double min_exact_match = -1, min_consistent = 1.0, min_token_agreement = -1,
         min_top1_agreement = -1, max_mean_logprob_diff = -1, max_logprob_diff = -1,
         min_similarity = -1, min_sampled_exact_match = -1;
};

// Exit 2 for everything that stops the run (the "could not run").
int CouldNotRun(const Status& st) {
  std::string msg = st.message();
  for (char& c : msg)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return kExitBadInput;
}

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return IoError("{}: cannot open for writing", path);
  f << text;
  f.close();
  if (!f) return IoError("{}: write failed", path);
  return Status::Ok();
}

Result<std::optional<double>> Threshold(double value, const char* flag, bool rate) {
  if (value < 0) return std::optional<double>();
  if (rate && value > 1) return InvalidArgument("{}: expected a rate in [0, 1], got {}", flag, value);
  return std::optional<double>(value);
}

Status ParseThresholds(CompareArgs& a) {
  tools::CompareThresholds& t = a.thresholds;
  DH_ASSIGN_OR_RETURN(t.min_exact_match, Threshold(a.min_exact_match, "--min-exact-match", true));
  DH_ASSIGN_OR_RETURN(t.min_consistent, Threshold(a.min_consistent, "--min-consistent", true));
  DH_ASSIGN_OR_RETURN(t.min_token_agreement,
                      Threshold(a.min_token_agreement, "--min-token-agreement", true));
  DH_ASSIGN_OR_RETURN(t.min_top1_agreement,
                      Threshold(a.min_top1_agreement, "--min-top1-agreement", true));
  DH_ASSIGN_OR_RETURN(t.max_mean_logprob_diff,
                      Threshold(a.max_mean_logprob_diff, "--max-mean-logprob-diff", false));
  DH_ASSIGN_OR_RETURN(t.max_logprob_diff, Threshold(a.max_logprob_diff, "--max-logprob-diff", false));
  DH_ASSIGN_OR_RETURN(t.min_similarity, Threshold(a.min_similarity, "--min-similarity", true));
  DH_ASSIGN_OR_RETURN(t.min_sampled_exact_match,
                      Threshold(a.min_sampled_exact_match, "--min-sampled-exact-match", true));
  return Status::Ok();
}

ModelOptions LocalModelOptions(const tools::CompareTargetSpec& t) {
  ModelOptions m;
  m.model_path = t.model_path;
  m.device = t.device;
  m.dtype = t.dtype;
  m.quant = t.quant;
  m.threads = t.threads;
  m.tp_size = t.tp;
  m.quiet = true;  // the load's own progress bar and info lines would interleave with ours
  m.no_compile_cache = true;  // compare what the checkpoint gives, not a cache file
  return m;
}

int Run(CompareArgs& a) {
  if (a.quiet) SetLogLevel(LogLevel::kError);
  if (Status st = ParseThresholds(a); !st.ok()) return CouldNotRun(st);
  if (Status st = tools::CheckCompareOptions(a.options); !st.ok()) return CouldNotRun(st);
  auto ta = tools::ParseCompareTarget(a.a, "--a");
  if (!ta.ok()) return CouldNotRun(ta.status());
  auto tb = tools::ParseCompareTarget(a.b, "--b");
  if (!tb.ok()) return CouldNotRun(tb.status());
  auto prompts = tools::ReadComparePrompts(a.prompts);
  if (!prompts.ok()) return CouldNotRun(prompts.status());
  if (a.options.api_key.empty()) {
    if (const char* env = std::getenv("DEEPHARNESS_API_KEY")) a.options.api_key = env;
  }

  // Local targets: loaded and served on loopback before anything runs.
  std::unique_ptr<InProcessServer> in_process_a, in_process_b;
  std::unique_ptr<ChildServer> child_a, child_b;
  tools::CompareEndpoint ea{ta->url, ta->model_name, "a"}, eb{tb->url, tb->model_name, "b"};
  const int http_threads = std::max(4, 2 * a.options.concurrency + 2);
  const int max_num_seqs = std::max(2, a.options.concurrency);
  auto start_local = [&](const tools::CompareTargetSpec& t, const std::string& name,
                         std::unique_ptr<InProcessServer>& in_process,
                         std::unique_ptr<ChildServer>& child) -> Result<std::string> {
    if (t.tp > 1) {
      DH_ASSIGN_OR_RETURN(child, ChildServer::Start(LocalModelOptions(t), name, max_num_seqs,
                                                    /*ready_timeout_s=*/600));
      return child->url();
    }
    DH_ASSIGN_OR_RETURN(in_process,
                        InProcessServer::Start(LocalModelOptions(t), name, max_num_seqs,
                                               http_threads));
    return in_process->url();
  };
  if (ta->local) {
    auto url = start_local(*ta, "a", in_process_a, child_a);
    if (!url.ok()) return CouldNotRun(url.status().WithContext("--a " + ta->text));
    ea = {*url, "a", "a"};
  }
  if (tb->local) {
    auto url = start_local(*tb, "b", in_process_b, child_b);
    if (!url.ok()) return CouldNotRun(url.status().WithContext("--b " + tb->text));
    eb = {*url, "b", "b"};
  }
  a.options.progress = a.options.progress && !a.quiet;
  auto result = tools::RunCompare(*prompts, ea, eb, a.options);
  for (auto* s : {in_process_a.get(), in_process_b.get()})
    if (s) s->Stop();
  for (auto* s : {child_a.get(), child_b.get()})
    if (s) s->Stop();
  if (!result.ok()) return CouldNotRun(result.status());
  if (ta->local) result->model_a = ta->model_path;
  if (tb->local) result->model_b = tb->model_path;

  tools::CompareReportInput in;
  in.result = &*result;
  in.options = &a.options;
  in.a = &*ta;
  in.b = &*tb;
  in.prompts_file = a.prompts;
  in.checks = tools::RunChecks(a.thresholds, result->greedy, result->sampled);
  in.pass = true;
  for (const tools::CompareCheck& c : in.checks) in.pass = in.pass && c.pass;

  const nlohmann::json doc = tools::CompareReportJson(in);
  const std::string json_text =
      doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (!a.json_file.empty()) {
    if (Status st = WriteText(a.json_file, json_text); !st.ok()) return CouldNotRun(st);
  }
  if (!a.markdown.empty()) {
    if (Status st = WriteText(a.markdown, tools::CompareReportMarkdown(in)); !st.ok())
      return CouldNotRun(st);
  }
  std::fputs(a.json ? json_text.c_str() : tools::CompareReportText(in).c_str(), stdout);
  return in.pass ? kExitOk : kExitFailure;
}

std::function<int()> SetupCompare(CLI::App* sub) {
  auto a = std::make_shared<CompareArgs>();
  tools::CompareOptions& o = a->options;
  sub->add_option("--a", a->a,
                  "Target A: an OpenAI-compatible base URL (http://HOST:PORT[,name=MODEL]) or a "
                  "local model spec model=DIR[,device=cpu][,dtype=auto][,quant=none][,tp=1]"
                  "[,threads=N]")
      ->required();
  sub->add_option("--b", a->b, "Target B (same forms as --a)")->required();
  sub->add_option("--prompts", a->prompts,
                  "JSONL file: one {\"prompt\": \"...\"} or {\"messages\": [...]} per line "
                  "(optional \"id\")")
      ->required();
  sub->add_option("--max-tokens", o.max_tokens, "Tokens generated per run (default 32)");
  sub->add_option("--top-logprobs", o.top_logprobs,
                  "Alternatives requested per token, the k of the top-k checks (default 5; "
                  "/v1/completions allows 5 at most on our server and vLLM)");
  sub->add_option("--samples", o.samples,
                  "Seeded sampled runs per prompt after the greedy one (default 2; 0: greedy only)");
  sub->add_option("--seed", o.seed, "Seed of sampled run i is SEED+i; sent with greedy runs too "
                                    "(default 1234)");
  sub->add_option("--temperature", o.temperature, "Sampled runs' temperature (default 0.8)");
  sub->add_option("--top-p", o.top_p, "Sampled runs' top_p (default 0.95)");
  sub->add_option("--concurrency", o.concurrency,
                  "Prompts in flight (default 1: batch composition cannot change the numbers)");
  sub->add_option("--timeout", o.timeout_s, "Per-request timeout, seconds (default 600)");
  sub->add_option("--api-key", o.api_key,
                  "Bearer key for URL targets (default: env DEEPHARNESS_API_KEY)");
  sub->add_flag("--json", a->json, "Print the JSON report instead of the summary");
  sub->add_option("--json-file", a->json_file, "Also write the JSON report to this file");
  sub->add_option("--markdown", a->markdown, "Also write a Markdown report to this file");
  sub->add_flag("--quiet,-q", a->quiet, "No progress bar and no log lines");
  sub->add_option("--min-exact-match", a->min_exact_match,
                  "Fail unless this fraction of greedy runs is identical (default: not checked)");
  sub->add_option("--min-consistent", a->min_consistent,
                  "Fail unless this fraction of greedy runs is identical or diverges with each "
                  "side's token in the other's top-k (default 1; negative: not checked)");
  sub->add_option("--min-token-agreement", a->min_token_agreement,
                  "Fail below this mean greedy token agreement (default: not checked)");
  sub->add_option("--min-top1-agreement", a->min_top1_agreement,
                  "Fail below this mean greedy top-1 agreement (default: not checked)");
  sub->add_option("--max-mean-logprob-diff", a->max_mean_logprob_diff,
                  "Fail above this mean |logprob A - logprob B| (default: not checked)");
  sub->add_option("--max-logprob-diff", a->max_logprob_diff,
                  "Fail above this largest |logprob A - logprob B| (default: not checked)");
  sub->add_option("--min-similarity", a->min_similarity,
                  "Fail below this mean greedy text similarity (default: not checked)");
  sub->add_option("--min-sampled-exact-match", a->min_sampled_exact_match,
                  "Fail unless this fraction of seeded sampled runs is identical (default: not "
                  "checked)");
  return [a]() -> int { return Run(*a); };
}

DH_REGISTER_COMMAND(compare_command, "compare",
                    "Do two deployments (URLs or local model specs) answer alike? Greedy and "
                    "seeded sampled runs, agreement metrics, thresholds, Markdown/JSON reports",
                    SetupCompare);

}  // namespace
}  // namespace dh::app
