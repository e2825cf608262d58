// `deepharness eval`: MMLU, CMMLU, C-Eval and GSM8K accuracy with lm-eval's methods, against any
// OpenAI-compatible server (--url) or an in-process engine (--model-path, served on a private
// loopback port so both paths run the very same client code), and `eval --compare A.json B.json`.
#include <cstdio>
#include <ctime>
#include <thread>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/model_options.h"
#include "engine/engine.h"
#include "server/http_server.h"
#include "server/template_renderer.h"
#include "tokenizer/tokenizer.h"
#include "tools/eval_compare.h"
#include "tools/eval_runner.h"

namespace dh::app {
namespace {

struct EvalArgs {
  tools::EvalOptions eval;
  std::string tasks = "mmlu,cmmlu,ceval,gsm8k";
  ModelOptions model;
  int max_seq_len = 0;
  int max_num_seqs = 64;
  bool json = false;
  std::vector<std::string> compare;
};

int ExitFor(const Status& st) {
  std::string msg = st.message();
  for (char& c : msg)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound
             ? kExitBadInput
             : kExitFailure;
}

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) out.push_back(item);
    pos = comma + 1;
  }
  return out;
}

int RunCompare(const EvalArgs& a) {
  auto ra = tools::ReadReport(a.compare[0]);
  if (!ra.ok()) return ExitFor(ra.status());
  auto rb = tools::ReadReport(a.compare[1]);
  if (!rb.ok()) return ExitFor(rb.status());
  const auto rows = tools::CompareReports(*ra, *rb);
  if (a.json) {
    std::printf("%s\n", tools::CompareJson(rows).dump(1).c_str());
  } else {
    std::fputs(tools::FormatCompare(rows, a.compare[0], a.compare[1]).c_str(), stdout);
  }
  return kExitOk;
}

int Report(const EvalArgs& a, const Result<nlohmann::json>& report) {
  if (!report.ok()) return ExitFor(report.status());
  std::fputs(a.json ? (report->dump(1) + "\n").c_str() : tools::FormatEvalSummary(*report).c_str(),
             stdout);
  return kExitOk;
}

// --model-path: loads the model, serves it on 127.0.0.1:<free port> inside this process and runs
// the HTTP client against it. Going through our own server (rather than calling the engine) keeps
// one scoring path, so an in-process score and a --url score of the same model are the same
// numbers by construction.
int RunInProcess(EvalArgs& a) {
  tools::EvalOptions& o = a.eval;
  if (Status st = tools::CheckEvalInputs(o); !st.ok()) return ExitFor(st);
  auto load = LoadFromOptions(a.model);
  if (!load.ok()) return ExitFor(load.status());
  auto tokenizer = Tokenizer::Load(a.model.model_path);
  if (!tokenizer.ok()) return ExitFor(tokenizer.status().WithContext(a.model.model_path));
  auto renderer = server::LoadChatRenderer(a.model.model_path, "");
  if (!renderer.ok()) return ExitFor(renderer.status());
  EngineOptions eo;
  eo.max_num_seqs = a.max_num_seqs;
  eo.max_model_len = a.max_seq_len;
  Engine engine(eo, std::move(load->model), *load->backend, tokenizer->get());
  if (Status st = engine.Start(); !st.ok()) return ExitFor(st);

  server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.served_model_names = {"eval-model"};
  so.http_threads = std::max(16, 2 * o.concurrency + 8);
  so.read_timeout = std::chrono::seconds(o.client.timeout_s);
  so.write_timeout = std::chrono::seconds(o.client.timeout_s);
  server::OpenAIServer http(so);
  if (Status st = http.Bind(); !st.ok()) return ExitFor(st);
  std::thread http_thread([&http] { http.Run(); });
  server::ServingContext ctx;
  ctx.engine = &engine;
  ctx.tokenizer = tokenizer->get();
  ctx.chat_renderer = renderer->get();
  ctx.model_load_seconds = load->load_seconds;
  ctx.model_created_unix = std::time(nullptr);
  http.Attach(ctx);

  o.client.url = "http://127.0.0.1:" + std::to_string(http.port());
  o.client.model.clear();
  o.extra_config = {{"model_path", a.model.model_path}, {"device", a.model.device},
                    {"dtype", a.model.dtype},           {"quant", a.model.quant},
                    {"policy", a.model.policy},         {"in_process", true}};
  auto report = tools::RunEval(o);
  engine.Stop();
  http.Stop();
  http_thread.join();
  return Report(a, report);
}

std::function<int()> SetupEval(CLI::App* sub) {
  auto a = std::make_shared<EvalArgs>();
  tools::EvalOptions& o = a->eval;
  sub->add_option("--tasks", a->tasks,
                  "Comma-separated: mmlu,cmmlu,ceval,gsm8k (default: all four)");
  sub->add_option("--data", o.data_dir,
                  "The dataset folder as published (one task), or a folder with one subfolder per "
                  "task named mmlu, cmmlu, ceval, gsm8k");
  sub->add_option("--url", o.client.url,
                  "OpenAI-compatible server (needs /v1/completions with echo+logprobs and "
                  "/tokenize; default http://127.0.0.1:8000)");
  sub->add_option("--model-name", o.client.model,
                  "Model name to send with --url (default: the server's first model)");
  sub->add_option("--api-key", o.client.api_key, "Bearer key (default: env DEEPHARNESS_API_KEY)");
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddKvCacheOptions(sub, &a->model);
  sub->add_option("--max-seq-len,--max-model-len", a->max_seq_len,
                  "With --model-path: the engine's context (default: the model's)");
  sub->add_option("--max-num-seqs", a->max_num_seqs,
                  "With --model-path: sequences batched per engine step (default 64)");
  sub->add_option("--num-fewshot", o.num_fewshot,
                  "Few-shot examples (default 5 for mmlu/cmmlu/ceval, 8 for gsm8k; gsm8k has 8 "
                  "exemplars at most)");
  sub->add_option("--limit", o.limit, "Only the first N items of each subject (gsm8k: N items)");
  sub->add_option("--concurrency", o.concurrency, "Requests in flight (default 1)");
  sub->add_option("--max-length", o.client.max_length,
                  "Prompt tokens kept (left-truncated) (default: the server's max_model_len - 1)");
  sub->add_option("--max-gen-toks", o.max_gen_toks, "gsm8k generation length (default 256)");
  sub->add_option("--seed", o.seed, "Request seed, recorded in the report (default 1234)");
  sub->add_option("--timeout", o.client.timeout_s, "Per-request timeout, seconds (default 600)");
  sub->add_option("--output", o.output,
                  "Write the JSON report (config, scores, every item) here; it is also saved "
                  "every 10 s while running");
  sub->add_flag("--resume", o.resume, "Keep the items already in --output and run only the rest");
  sub->add_flag("--json", a->json, "Print the report JSON instead of the summary");
  sub->add_flag(
      "--no-progress", [o = &o](int64_t) { o->progress = false; }, "No progress bar");
  sub->add_option("--compare", a->compare, "Compare two reports: --compare A.json B.json")
      ->expected(2);
  return [a, sub]() -> int {
    if (!a->compare.empty()) return RunCompare(*a);
    if (!a->model.model_path.empty() && sub->count("--url") > 0)
      return ExitFor(
          InvalidArgument("--url and --model-path: give one (--model-path serves the "
                          "model in-process)"));
    tools::EvalOptions& o = a->eval;
    o.tasks = SplitList(a->tasks);
    if (o.client.api_key.empty()) {
      if (const char* env = std::getenv("DEEPHARNESS_API_KEY")) o.client.api_key = env;
    }
    if (a->model.model_path.empty()) return Report(*a, tools::RunEval(o));
    return RunInProcess(*a);
  };
}

DH_REGISTER_COMMAND(eval_command, "eval",
                    "Accuracy on MMLU, CMMLU, C-Eval and GSM8K with lm-eval's methods, against a "
                    "server or --model-path; --compare two reports with a paired test",
                    SetupEval);

}  // namespace
}  // namespace dh::app
