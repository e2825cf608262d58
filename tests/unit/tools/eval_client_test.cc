// eval against an in-test fake OpenAI server (cpp-httplib) whose tokenizer is bytes and whose
// logprobs are known: the continuation sum, perfect and uniform scorers, truncation, GSM8K
// generation with stop sequences, resume from a partial report, and errors.
#include "tools/eval_client.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "tools/eval_data.h"
#include "tools/eval_runner.h"
#include "tools/eval_tasks.h"

namespace dh::tools {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kData = std::string(DH_SOURCE_DIR) + "/tests/unit/tools/data/eval";
constexpr int kBos = 256;

// Logprob of answer letter `letter` after `context` (the text before " X").
using McPolicy = std::function<double(const std::string& context, char letter)>;
using GenPolicy = std::function<std::string(const std::string& prompt)>;

class FakeServer {
 public:
  FakeServer(McPolicy mc, GenPolicy gen, int max_model_len = 1 << 16)
      : mc_(std::move(mc)), gen_(std::move(gen)), max_model_len_(max_model_len) {
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(Json{{"data", {{{"id", "fake"}, {"max_model_len", max_model_len_}}}}}.dump(),
                      "application/json");
    });
    server_.Post("/tokenize", [](const httplib::Request& req, httplib::Response& res) {
      const std::string text = Json::parse(req.body)["prompt"];
      Json ids = Json::array({kBos});
      for (unsigned char c : text) ids.push_back(c);
      res.set_content(Json{{"tokens", ids}}.dump(), "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      completions++;
      if (fail_status > 0) {
        res.status = fail_status;
        res.set_content(R"({"error":{"message":"fake failure"}})", "application/json");
        return;
      }
      const Json body = Json::parse(req.body);
      Json prompts = body["prompt"];
      if (!prompts[0].is_array()) prompts = Json::array({prompts});
      Json choices = Json::array();
      for (size_t p = 0; p < prompts.size(); ++p) {
        std::vector<int> ids = prompts[p].get<std::vector<int>>();
        size_t seen = longest_prompt.load();
        while (ids.size() > seen && !longest_prompt.compare_exchange_weak(seen, ids.size())) {
        }
        std::string text;
        for (int id : ids)
          if (id != kBos) text.push_back(static_cast<char>(id));
        if (body.value("echo", false)) {
          Json lps = Json::array({nullptr});
          for (size_t t = 1; t < ids.size(); ++t) {
            const bool letter = t + 1 == ids.size() && ids[t - 1] == ' ';
            const bool space = t + 2 == ids.size() && ids[t] == ' ';
            lps.push_back(letter  ? mc_(text.substr(0, text.size() - 2), static_cast<char>(ids[t]))
                          : space ? -0.25
                                  : -1.0);
          }
          lps.push_back(-0.5);  // the one generated token
          choices.push_back({{"index", p},
                             {"text", text + "x"},
                             {"logprobs", {{"token_logprobs", lps}}},
                             {"finish_reason", "length"}});
        } else {
          choices.push_back({{"index", p}, {"text", gen_(text)}, {"finish_reason", "stop"}});
        }
      }
      res.set_content(Json{{"choices", choices}}.dump(), "application/json");
    });
    server_.set_tcp_nodelay(true);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int> completions{0};
  std::atomic<size_t> longest_prompt{0};
  std::atomic<int> fail_status{0};

 private:
  McPolicy mc_;
  GenPolicy gen_;
  int max_model_len_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

std::string NoGen(const std::string&) { return ""; }

// The query's question: the first line after the last blank line of the prompt.
std::string QueryQuestion(const std::string& context) {
  const size_t p = context.rfind("\n\n");
  const std::string query = p == std::string::npos ? context : context.substr(p + 2);
  return query.substr(0, query.find("\nA. "));
}

uint64_t Fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A synthetic MMLU folder: `subjects` x `per_subject` questions with random gold letters.
struct Synthetic {
  fs::path dir;
  std::map<std::string, char> gold;  // question -> letter
};
Synthetic MakeSynthetic(const std::string& name, int subjects, int per_subject) {
  Synthetic s;
  s.dir = fs::temp_directory_path() / ("dh_eval_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(s.dir);
  fs::create_directories(s.dir / "data" / "dev");
  fs::create_directories(s.dir / "data" / "test");
  std::mt19937 rng(7);
  for (int k = 0; k < subjects; ++k) {
    const std::string subject = "subject_" + std::to_string(k);
    for (const std::string split : {"dev", "test"}) {
      std::ofstream out(s.dir / "data" / split / (subject + "_" + split + ".csv"));
      const int n = split == "dev" ? 5 : per_subject;
      for (int i = 0; i < n; ++i) {
        const std::string q = fmt::format("Question {} {} {}, with a comma?", split, k, i);
        const char letter = static_cast<char>('A' + rng() % 4);
        if (split == "test") s.gold[q] = letter;
        out << '"' << q << "\",one,two,\"th\"\"ree\",four," << letter << "\n";
      }
    }
  }
  return s;
}

EvalOptions Options(const FakeServer& server, const std::string& tasks, const std::string& data) {
  EvalOptions o;
  o.tasks = {};
  size_t pos = 0;
  while (pos <= tasks.size()) {
    size_t comma = tasks.find(',', pos);
    if (comma == std::string::npos) comma = tasks.size();
    o.tasks.push_back(tasks.substr(pos, comma - pos));
    pos = comma + 1;
  }
  o.data_dir = data;
  o.client.url = server.url();
  o.client.max_retries = 0;
  o.progress = false;
  return o;
}

TEST(EvalClient, SumsOnlyTheContinuationTokens) {
  FakeServer server(
      [](const std::string& context, char letter) {
        EXPECT_EQ(context, "Q: x\nAnswer:");
        return letter == 'A' ? -2.0 : -0.5;
      },
      NoGen);
  EvalClientOptions o;
  o.url = server.url() + "/v1";
  auto resolved = CompletionClient::Resolve(o);
  ASSERT_TRUE(resolved.ok()) << resolved.status().message();
  EXPECT_EQ(resolved->model, "fake");
  EXPECT_EQ(resolved->max_length, (1 << 16) - 1);
  CompletionClient client(*resolved);
  auto scores = client.Loglikelihoods("Q: x\nAnswer:", {" A", " B"});
  ASSERT_TRUE(scores.ok()) << scores.status().message();
  ASSERT_EQ(scores->size(), 2u);
  // " " (-0.25) + the letter; the context's 13 tokens (-1 each) are not counted.
  EXPECT_DOUBLE_EQ((*scores)[0].logprob, -2.25);
  EXPECT_DOUBLE_EQ((*scores)[1].logprob, -0.75);
  EXPECT_EQ((*scores)[0].num_tokens, 2);
  EXPECT_FALSE((*scores)[0].truncated);
  // A trailing space of the context moves onto the continuation (lm-eval's _encode_pair).
  auto moved = client.Loglikelihoods("Q: x\nAnswer: ", {"A", "B"});
  ASSERT_TRUE(moved.ok());
  EXPECT_DOUBLE_EQ((*moved)[0].logprob, -2.25);
  EXPECT_EQ(server.completions.load(), 2);
}

TEST(EvalRun, PerfectScorerGets100Percent) {
  const Synthetic data = MakeSynthetic("perfect", 2, 100);
  FakeServer server(
      [&](const std::string& context, char letter) {
        return data.gold.at(QueryQuestion(context)) == letter ? -0.1 : -4.0;
      },
      NoGen);
  EvalOptions o = Options(server, "mmlu", data.dir.string());
  o.concurrency = 4;
  auto report = RunEval(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  const Json& r = (*report)["results"]["mmlu"];
  EXPECT_EQ(r["n"], 200);
  EXPECT_DOUBLE_EQ(r["acc"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["acc_macro"].get<double>(), 1.0);
  EXPECT_EQ(r["num_subjects"], 2);
  EXPECT_EQ((*report)["items"].size(), 200u);
  EXPECT_TRUE((*report)["complete"].get<bool>());
  EXPECT_EQ((*report)["config"]["num_fewshot"]["mmlu"], 5);
  fs::remove_all(data.dir);
}

TEST(EvalRun, UniformScorerIsNearChance) {
  const Synthetic data = MakeSynthetic("uniform", 2, 200);
  // Letter logprobs that ignore the question: pseudo-random per prompt and letter.
  FakeServer server(
      [](const std::string& context, char letter) {
        return -static_cast<double>(Fnv(context + letter) % 1000) / 250.0;
      },
      NoGen);
  EvalOptions o = Options(server, "mmlu", data.dir.string());
  o.concurrency = 8;
  auto report = RunEval(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  const Json& r = (*report)["results"]["mmlu"];
  ASSERT_EQ(r["n"], 400);
  // Chance is 0.25; the standard error at n=400 is ~0.022. The scores are deterministic (hash of
  // the prompt), so this bound of 4 standard errors cannot flake.
  EXPECT_NEAR(r["acc"].get<double>(), 0.25, 0.087);
  EXPECT_NEAR(r["acc_stderr"].get<double>(), std::sqrt(0.25 * 0.75 / 399), 0.004);
  fs::remove_all(data.dir);
}

TEST(EvalRun, AllFourLayoutsThroughTheClient) {
  std::map<std::string, char> gold;
  for (McTask t : {McTask::kMmlu, McTask::kCmmlu, McTask::kCeval}) {
    auto subjects = LoadMcTask(t, kData + "/" + McTaskName(t));
    ASSERT_TRUE(subjects.ok());
    for (const auto& s : *subjects)
      for (const auto& item : s.eval) {
        const std::string query = McQueryText(t, item);
        gold[query.substr(0, query.find("\nA. "))] = static_cast<char>('A' + item.gold);
      }
  }
  std::map<std::string, std::string> answers;
  auto items = LoadGsm8k(kData + "/gsm8k");
  ASSERT_TRUE(items.ok());
  for (const auto& item : *items) answers[item.question] = GsmTarget(item.answer);
  FakeServer server(
      [&](const std::string& context, char letter) {
        return gold.at(QueryQuestion(context)) == letter ? -0.1 : -4.0;
      },
      [&](const std::string& prompt) {
        const size_t q = prompt.rfind("Q: ");
        const std::string question = prompt.substr(q + 3, prompt.size() - q - 3 - 3);
        // The stop sequence is left in: the client must cut there.
        return " Some steps. The answer is " + answers.at(question) + ".\n\nQ: next question";
      });
  EvalOptions o = Options(server, "mmlu,cmmlu,ceval,gsm8k", kData);
  o.num_fewshot = 1;
  o.concurrency = 3;
  auto report = RunEval(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  const Json& res = (*report)["results"];
  EXPECT_DOUBLE_EQ(res["mmlu"]["acc"].get<double>(), 1.0);
  EXPECT_EQ(res["mmlu"]["n"], 5);
  EXPECT_DOUBLE_EQ(res["mmlu"]["subjects"]["abstract_algebra"]["acc"].get<double>(), 1.0);
  EXPECT_EQ(res["mmlu"]["categories"]["stem"]["n"], 3);
  EXPECT_EQ(res["mmlu"]["categories"]["social_sciences"]["n"], 2);
  EXPECT_DOUBLE_EQ(res["cmmlu"]["acc"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(res["ceval"]["acc"].get<double>(), 1.0);
  EXPECT_EQ(res["ceval"]["categories"]["STEM"]["n"], 2);
  EXPECT_DOUBLE_EQ(res["gsm8k"]["exact_match,strict-match"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(res["gsm8k"]["exact_match,flexible-extract"].get<double>(), 1.0);
  for (const Json& r : (*report)["items"]) {
    if (r["task"] != "gsm8k") continue;
    EXPECT_EQ(r["response"].get<std::string>().find("Q:"), std::string::npos);
  }
  EXPECT_EQ((*report)["config"]["num_fewshot"]["gsm8k"], 1);
}

TEST(EvalRun, LeftTruncatesToMaxLength) {
  FakeServer server([](const std::string&, char letter) { return letter == 'C' ? -0.1 : -3.0; },
                    [](const std::string&) { return std::string(" The answer is 7."); }, 64);
  EvalOptions o = Options(server, "mmlu", kData + "/mmlu");
  auto report = RunEval(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(server.longest_prompt.load(), 63u);  // max_model_len - 1
  for (const Json& r : (*report)["items"]) {
    EXPECT_TRUE(r["truncated"].get<bool>());
    EXPECT_EQ(r["pred"], "C");
  }
  o = Options(server, "gsm8k", kData + "/gsm8k");
  o.max_gen_toks = 16;
  auto gsm = RunEval(o);
  ASSERT_TRUE(gsm.ok()) << gsm.status().message();
  for (const Json& r : (*gsm)["items"]) EXPECT_EQ(r["prompt_tokens"], 64 - 16);
  o.max_gen_toks = 64;
  auto too_long = RunEval(o);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("--max-gen-toks 64"), std::string::npos);
}

TEST(EvalRun, ResumesFromAPartialReport) {
  const Synthetic data = MakeSynthetic("resume", 2, 10);
  FakeServer server([&](const std::string& c,
                        char l) { return data.gold.at(QueryQuestion(c)) == l ? 0.0 : -1.0; },
                    NoGen);
  const std::string out = (data.dir / "report.json").string();
  EvalOptions o = Options(server, "mmlu", data.dir.string());
  o.output = out;
  o.limit = 2;
  ASSERT_TRUE(RunEval(o).ok());
  EXPECT_EQ(server.completions.load(), 4);
  o.limit = 3;
  o.resume = true;
  auto report = RunEval(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(server.completions.load(), 6);  // only the third item of each subject was asked
  EXPECT_EQ((*report)["resumed_items"], 4);
  EXPECT_EQ((*report)["items"].size(), 6u);
  auto saved = ReadReport(out);
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ((*saved)["items"].size(), 6u);
  EXPECT_TRUE((*saved)["complete"].get<bool>());
  // A different few-shot setting cannot reuse these records.
  o.num_fewshot = 0;
  auto mismatch = RunEval(o);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("config.num_fewshot.mmlu is 5"), std::string::npos)
      << mismatch.status().message();
  fs::remove_all(data.dir);
}

TEST(EvalRun, ServerErrorsStopTheRunAndKeepTheRecords) {
  FakeServer server([](const std::string&, char) { return -1.0; }, NoGen);
  server.fail_status = 400;
  const std::string out =
      (fs::temp_directory_path() / ("dh_eval_err_" + std::to_string(::getpid()) + ".json"))
          .string();
  EvalOptions o = Options(server, "mmlu", kData + "/mmlu");
  o.output = out;
  o.concurrency = 2;
  auto report = RunEval(o);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("HTTP 400: fake failure"), std::string::npos)
      << report.status().message();
  EXPECT_NE(report.status().message().find("--resume"), std::string::npos);
  auto saved = ReadReport(out);
  ASSERT_TRUE(saved.ok());
  EXPECT_FALSE((*saved)["complete"].get<bool>());
  fs::remove(out);
}

TEST(EvalRun, BadFlagsAndData) {
  FakeServer server([](const std::string&, char) { return -1.0; }, NoGen);
  EvalOptions o = Options(server, "mmlu,arc", kData);
  auto r = RunEval(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--tasks: 'arc': expected mmlu, cmmlu, ceval or gsm8k");
  o = Options(server, "ceval", kData + "/nowhere");
  r = RunEval(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("nowhere/val: no such folder"), std::string::npos);
  o = Options(server, "mmlu", kData + "/mmlu");
  o.client.url = "localhost:8000";
  r = RunEval(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(server.completions.load(), 0);
}

}  // namespace
}  // namespace dh::tools
