// The eval run: plan (datasets -> work units), worker pool, checkpoints/resume, scoring, report.
#include "tools/eval_runner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "base/mapped_file.h"
#include "base/progress.h"
#include "tools/eval_data.h"
#include "tools/eval_tasks.h"

namespace dh::tools {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr int kReportVersion = 1;

// One request's worth of work: a multiple-choice question or a GSM8K problem.
struct Unit {
  std::string key;  // task/subject/index: stable across runs, used by resume and compare
  std::string task, subject;
  int index = 0;
  std::string prompt;  // the full context (MC) or generation prompt (gsm8k)
  int gold = -1;       // MC
  std::string target;  // gsm8k
};

std::optional<McTask> McTaskOf(const std::string& name) {
  if (name == "mmlu") return McTask::kMmlu;
  if (name == "cmmlu") return McTask::kCmmlu;
  if (name == "ceval") return McTask::kCeval;
  return std::nullopt;
}

int FewshotFor(const EvalOptions& o, const std::string& task) {
  if (o.num_fewshot >= 0)
    return task == "gsm8k" ? std::min(o.num_fewshot, kGsmMaxFewshot) : o.num_fewshot;
  return task == "gsm8k" ? kGsmMaxFewshot : 5;
}

Result<std::vector<Unit>> Plan(const EvalOptions& o) {
  std::vector<Unit> units;
  for (const std::string& task : o.tasks) {
    const std::string dir =
        o.tasks.size() == 1 ? o.data_dir : (fs::path(o.data_dir) / task).string();
    const int shots = FewshotFor(o, task);
    if (auto mc = McTaskOf(task)) {
      auto subjects = LoadMcTask(*mc, dir);
      if (!subjects.ok()) return subjects.status();
      for (const McSubject& s : *subjects) {
        const size_t n = o.limit > 0 ? std::min<size_t>(o.limit, s.eval.size()) : s.eval.size();
        for (size_t i = 0; i < n; ++i) {
          Unit u;
          u.task = task;
          u.subject = s.name;
          u.index = static_cast<int>(i);
          u.key = fmt::format("{}/{}/{}", task, s.name, i);
          u.prompt = McPrompt(*mc, s.name, s.dev, shots, s.eval[i]);
          u.gold = s.eval[i].gold;
          units.push_back(std::move(u));
        }
      }
    } else {
      auto items = LoadGsm8k(dir);
      if (!items.ok()) return items.status();
      const size_t n = o.limit > 0 ? std::min<size_t>(o.limit, items->size()) : items->size();
      for (size_t i = 0; i < n; ++i) {
        Unit u;
        u.task = task;
        u.index = static_cast<int>(i);
        u.key = fmt::format("gsm8k/{}", i);
        u.prompt = GsmPrompt((*items)[i].question, shots);
        u.target = GsmTarget((*items)[i].answer);
        units.push_back(std::move(u));
      }
    }
  }
  return units;
}

Result<Json> RunUnit(CompletionClient& client, const Unit& u, int max_gen_toks) {
  Json r = {{"key", u.key}, {"task", u.task}, {"index", u.index}};
  if (!u.subject.empty()) r["subject"] = u.subject;
  if (u.task != "gsm8k") {
    auto scores = client.Loglikelihoods(u.prompt, {" A", " B", " C", " D"});
    if (!scores.ok()) return scores.status().WithContext(u.key);
    Json lps = Json::array();
    int pred = 0;
    bool truncated = false;
    for (int k = 0; k < 4; ++k) {
      lps.push_back((*scores)[k].logprob);
      truncated |= (*scores)[k].truncated;
      if ((*scores)[k].logprob > (*scores)[pred].logprob) pred = k;
    }
    r["gold"] = std::string(1, static_cast<char>('A' + u.gold));
    r["pred"] = std::string(1, static_cast<char>('A' + pred));
    r["correct"] = pred == u.gold;
    r["logprobs"] = lps;
    r["truncated"] = truncated;
    return r;
  }
  auto g = client.Generate(u.prompt, GsmStopSequences(), max_gen_toks);
  if (!g.ok()) return g.status().WithContext(u.key);
  const std::string strict = GsmStrictExtract(g->text), flexible = GsmFlexibleExtract(g->text);
  r["target"] = u.target;
  r["response"] = g->text;
  r["strict"] = strict;
  r["flexible"] = flexible;
  r["strict_correct"] = GsmExactMatch(strict, u.target);
  r["flexible_correct"] = GsmExactMatch(flexible, u.target);
  r["prompt_tokens"] = g->prompt_tokens;
  r["truncated"] = g->truncated;
  return r;
}

// Mean and lm-eval's standard error (sample std / sqrt(n)) of 0/1 outcomes.
struct Acc {
  double mean = 0, stderr_ = 0;
  int64_t n = 0;
};
Acc Accuracy(int64_t correct, int64_t n) {
  Acc a;
  a.n = n;
  if (n == 0) return a;
  a.mean = static_cast<double>(correct) / n;
  a.stderr_ = n > 1 ? std::sqrt(a.mean * (1 - a.mean) / (n - 1)) : 0;
  return a;
}

Json AccJson(const Acc& a, const char* name = "acc") {
  return {{name, a.mean}, {std::string(name) + "_stderr", a.stderr_}, {"n", a.n}};
}

// The configuration fields two runs must share for their records to be interchangeable.
const char* const kResumeKeys[] = {"model", "num_fewshot", "max_length", "max_gen_toks", "method"};

}  // namespace

Json ScoreRecords(const Json& items) {
  struct Tally {
    int64_t correct = 0, n = 0;
  };
  std::map<std::string, std::map<std::string, Tally>> subjects;    // task -> subject
  std::map<std::string, std::map<std::string, Tally>> categories;  // task -> category
  std::map<std::string, Tally> strict, flexible;
  for (const Json& r : items) {
    const std::string task = r.value("task", "");
    if (task == "gsm8k") {
      strict[task].n++;
      flexible[task].n++;
      strict[task].correct += r.value("strict_correct", false);
      flexible[task].correct += r.value("flexible_correct", false);
      continue;
    }
    const std::string subject = r.value("subject", "");
    const bool ok = r.value("correct", false);
    Tally& s = subjects[task][subject];
    s.n++;
    s.correct += ok;
    auto mc = McTaskOf(task);
    const std::string category = mc ? SubjectCategory(*mc, subject) : "";
    if (!category.empty()) {
      categories[task][category].n++;
      categories[task][category].correct += ok;
    }
  }
  Json results = Json::object();
  for (const auto& [task, per_subject] : subjects) {
    Tally all;
    double macro = 0, macro_var = 0;
    Json js = Json::object();
    for (const auto& [subject, t] : per_subject) {
      all.correct += t.correct;
      all.n += t.n;
      const Acc a = Accuracy(t.correct, t.n);
      macro += a.mean;
      macro_var += a.stderr_ * a.stderr_;
      Json j = AccJson(a);
      if (auto mc = McTaskOf(task)) {
        const std::string c = SubjectCategory(*mc, subject);
        if (!c.empty()) j["category"] = c;
      }
      js[subject] = j;
    }
    const double k = static_cast<double>(per_subject.size());
    Json jt = AccJson(Accuracy(all.correct, all.n));
    jt["acc_norm"] = jt["acc"];  // one-letter choices: acc_norm == acc (conventions.md §f)
    jt["acc_macro"] = macro / k;
    jt["acc_macro_stderr"] = std::sqrt(macro_var) / k;
    jt["num_subjects"] = per_subject.size();
    Json jc = Json::object();
    for (const auto& [category, t] : categories[task])
      jc[category] = AccJson(Accuracy(t.correct, t.n));
    jt["categories"] = jc;
    jt["subjects"] = js;
    results[task] = jt;
  }
  for (const auto& [task, t] : strict) {
    const Acc s = Accuracy(t.correct, t.n), f = Accuracy(flexible[task].correct, t.n);
    results[task] = {{"exact_match,strict-match", s.mean},
                     {"exact_match_stderr,strict-match", s.stderr_},
                     {"exact_match,flexible-extract", f.mean},
                     {"exact_match_stderr,flexible-extract", f.stderr_},
                     {"n", t.n}};
  }
  return results;
}

Status WriteReport(const Json& report, const std::string& path) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return IoError("{}: cannot write", tmp);
    out << report.dump(1, ' ', false, Json::error_handler_t::replace) << '\n';
    if (!out) return IoError("{}: write failed", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return IoError("{}: cannot rename to {}: {}", tmp, path, ec.message());
  return Status::Ok();
}

Result<Json> ReadReport(const std::string& path) {
  auto text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  Json j = Json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("items") || !j["items"].is_array() ||
      !j.contains("config") || !j["config"].is_object())
    return InvalidArgument("{}: expected a deepharness eval report (JSON with config and items)",
                           path);
  return j;
}

namespace {

Status CheckFlags(const EvalOptions& o) {
  if (o.tasks.empty())
    return InvalidArgument("--tasks: expected one or more of mmlu,cmmlu,ceval,gsm8k");
  std::set<std::string> seen;
  for (const std::string& t : o.tasks) {
    if (std::find(std::begin(kEvalTasks), std::end(kEvalTasks), t) == std::end(kEvalTasks))
      return InvalidArgument("--tasks: '{}': expected mmlu, cmmlu, ceval or gsm8k", t);
    if (!seen.insert(t).second) return InvalidArgument("--tasks: '{}' is listed twice", t);
  }
  if (o.data_dir.empty()) return InvalidArgument("--data: expected the dataset folder");
  if (o.concurrency < 1 || o.concurrency > 1024)
    return InvalidArgument("--concurrency: expected 1-1024, got {}", o.concurrency);
  if (o.limit < 0) return InvalidArgument("--limit: expected >= 0, got {}", o.limit);
  if (o.num_fewshot < -1)
    return InvalidArgument("--num-fewshot: expected >= 0, got {}", o.num_fewshot);
  if (o.max_gen_toks < 1)
    return InvalidArgument("--max-gen-toks: expected >= 1, got {}", o.max_gen_toks);
  if (o.resume && o.output.empty()) return InvalidArgument("--resume: needs --output FILE");

  return Status::Ok();
}

}  // namespace

Status CheckEvalInputs(const EvalOptions& o) {
  if (Status st = CheckFlags(o); !st.ok()) return st;
  auto units = Plan(o);
  return units.ok() ? Status::Ok() : units.status();
}

Result<Json> RunEval(const EvalOptions& o) {
  if (Status st = CheckFlags(o); !st.ok()) return st;
  auto units = Plan(o);
  if (!units.ok()) return units.status();
  auto client_options = CompletionClient::Resolve(o.client);
  if (!client_options.ok()) return client_options.status();

  Json config = {{"tasks", o.tasks},
                 {"data", o.data_dir},
                 {"url", o.client.url},
                 {"model", client_options->model},
                 {"limit", o.limit},
                 {"concurrency", o.concurrency},
                 {"seed", o.seed},
                 {"max_length", client_options->max_length},
                 {"max_gen_toks", o.max_gen_toks},
                 {"method",
                  "lm-eval: first_n few-shot; MC letter loglikelihood via /v1/completions "
                  "echo+logprobs; gsm8k_cot greedy, strict+flexible filters"}};
  Json fewshot = Json::object();
  for (const std::string& t : o.tasks) fewshot[t] = FewshotFor(o, t);
  config["num_fewshot"] = fewshot;
  if (!o.extra_config.is_null()) config["extra"] = o.extra_config;

  // Records by key; resumed ones first.
  std::map<std::string, Json> records;
  if (o.resume && fs::exists(o.output)) {
    auto old = ReadReport(o.output);
    if (!old.ok()) return old.status();
    for (const std::string k : kResumeKeys) {
      const Json before = (*old)["config"].value(k, Json());
      const Json& now = config[k];
      if (k == "num_fewshot" && before.is_object()) {
        for (const auto& [task, shots] : now.items())
          if (before.contains(task) && before[task] != shots)
            return InvalidArgument(
                "{}: config.num_fewshot.{} is {} but this run has {}; use another "
                "--output",
                o.output, task, before[task].dump(), shots.dump());
      } else if (before != now) {
        return InvalidArgument("{}: config.{} is {} but this run has {}; use another --output",
                               o.output, k, before.dump(), now.dump());
      }
    }
    std::set<std::string> planned;
    for (const Unit& u : *units) planned.insert(u.key);
    for (const Json& r : (*old)["items"])
      if (r.is_object() && planned.count(r.value("key", ""))) records[r["key"]] = r;
  }
  std::vector<const Unit*> todo;
  for (const Unit& u : *units)
    if (!records.count(u.key)) todo.push_back(&u);
  const size_t resumed = records.size();

  const auto started = std::chrono::steady_clock::now();
  auto make_report = [&](bool complete) {
    Json items = Json::array();
    for (const Unit& u : *units) {
      auto it = records.find(u.key);
      if (it != records.end()) items.push_back(it->second);
    }
    Json report = {
        {"version", kReportVersion},
        {"complete", complete},
        {"config", config},
        {"num_items", units->size()},
        {"resumed_items", resumed},
        {"elapsed_s",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()}};
    report["results"] = ScoreRecords(items);
    report["items"] = std::move(items);
    return report;
  };

  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  Status first_error = Status::Ok();
  size_t done = resumed;
  auto last_save = std::chrono::steady_clock::now();
  ProgressBar bar("eval", units->size(), o.progress);
  bar.Update(done);
  auto worker = [&] {
    CompletionClient client(*client_options);
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= todo.size()) return;
      auto r = RunUnit(client, *todo[i], o.max_gen_toks);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        if (!failed.exchange(true)) first_error = r.status();
        return;
      }
      records[todo[i]->key] = std::move(r).value();
      bar.Update(++done);
      const auto now = std::chrono::steady_clock::now();
      if (!o.output.empty() &&
          std::chrono::duration<double>(now - last_save).count() >= o.checkpoint_interval_s) {
        last_save = now;
        if (Status st = WriteReport(make_report(false), o.output);
            !st.ok() && !failed.exchange(true))
          first_error = st;
      }
    }
  };
  std::vector<std::thread> threads;
  const int n_threads =
      static_cast<int>(std::min<size_t>(o.concurrency, std::max<size_t>(todo.size(), 1)));
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  bar.Finish();

  const bool complete = !failed.load();
  Json report = make_report(complete);
  report["items_per_s"] =
      todo.empty() ? 0.0 : (done - resumed) / std::max(1e-9, report["elapsed_s"].get<double>());
  if (!o.output.empty()) {
    if (Status st = WriteReport(report, o.output); !st.ok()) return st;
  }
  if (!complete) {
    const std::string hint =
        o.output.empty()
            ? ""
            : fmt::format(" ({} items saved in {}; rerun with --resume)", done, o.output);
    return Status(first_error.code(), first_error.message() + hint);
  }
  return report;
}

std::string FormatEvalSummary(const Json& report) {
  std::string out;
  const Json& results = report.value("results", Json::object());
  for (const auto& [task, r] : results.items()) {
    if (task == "gsm8k") {
      out += fmt::format("{:<8} exact_match strict-match     {:.4f} ± {:.4f}  (n={})\n", task,
                         r.value("exact_match,strict-match", 0.0),
                         r.value("exact_match_stderr,strict-match", 0.0), r.value("n", 0));
      out += fmt::format("{:<8} exact_match flexible-extract {:.4f} ± {:.4f}\n", "",
                         r.value("exact_match,flexible-extract", 0.0),
                         r.value("exact_match_stderr,flexible-extract", 0.0));
      continue;
    }
    out += fmt::format(
        "{:<8} acc {:.4f} ± {:.4f} (micro, n={}), {:.4f} ± {:.4f} (macro over {} subjects)\n", task,
        r.value("acc", 0.0), r.value("acc_stderr", 0.0), r.value("n", 0), r.value("acc_macro", 0.0),
        r.value("acc_macro_stderr", 0.0), r.value("num_subjects", 0));
    const Json categories = r.value("categories", Json::object());
    for (const auto& [category, c] : categories.items())
      out += fmt::format("  {:<22} acc {:.4f} ± {:.4f} (n={})\n", category, c.value("acc", 0.0),
                         c.value("acc_stderr", 0.0), c.value("n", 0));
  }
  return out;
}

}  // namespace dh::tools
