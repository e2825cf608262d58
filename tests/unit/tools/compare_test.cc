// `deepharness compare` without a model: the metrics of two completions, their summaries and
// checks, the prompts file and target spec parsers (each bad input named), and the reports.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tools/compare.h"
#include "tools/compare_metrics.h"
#include "tools/compare_report.h"

namespace dh::tools {
namespace {

namespace fs = std::filesystem;

// Tokens with a logprob and a top-k list (`top` best first).
CompareToken Tok(std::string token, double lp, std::vector<std::string> top = {}) {
  CompareToken t;
  t.token = std::move(token);
  t.logprob = lp;
  double v = lp;
  for (auto& s : top) t.top.push_back({s, v--});
  return t;
}

CompareCompletion Completion(std::vector<CompareToken> tokens) {
  CompareCompletion c;
  c.has_tokens = true;
  for (const CompareToken& t : tokens) c.text += t.token;
  c.tokens = std::move(tokens);
  return c;
}

TEST(CompareMetricsTest, IdenticalRunsAgreeEverywhere) {
  auto a = Completion({Tok("Hel", -0.1, {"Hel", "He"}), Tok("lo", -0.2, {"lo", "p"})});
  const PairMetrics m = ComparePair(a, a);
  EXPECT_TRUE(m.exact);
  EXPECT_EQ(m.first_divergence, -1);
  EXPECT_EQ(m.first_divergence_char, -1);
  EXPECT_DOUBLE_EQ(*m.token_agreement, 1.0);
  EXPECT_DOUBLE_EQ(*m.top1_agreement, 1.0);
  EXPECT_DOUBLE_EQ(*m.mean_logprob_diff, 0.0);
  EXPECT_EQ(m.logprob_positions, 2);
  EXPECT_TRUE(*m.consistent);
  EXPECT_DOUBLE_EQ(m.similarity, 1.0);
  EXPECT_FALSE(m.a_in_b_topk.has_value());
}

TEST(CompareMetricsTest, DivergenceWithinTopKIsConsistent) {
  // Same first two tokens (logprobs differ by 0.1 and 0.3), then A says "x" and B says "y",
  // each among the other's alternatives; then one more token each.
  auto a = Completion({Tok("a", -1.0, {"a", "b"}), Tok("b", -0.5, {"b"}),
                       Tok("x", -0.7, {"x", "y"}), Tok("z", -0.1, {"z"})});
  auto b = Completion({Tok("a", -1.1, {"a", "b"}), Tok("b", -0.2, {"b"}),
                       Tok("y", -0.6, {"y", "x"}), Tok("z", -0.1, {"z"})});
  const PairMetrics m = ComparePair(a, b);
  EXPECT_FALSE(m.exact);
  EXPECT_EQ(m.first_divergence, 2);
  EXPECT_EQ(m.first_divergence_char, 2);
  EXPECT_EQ(m.token_a, "x");
  EXPECT_EQ(m.token_b, "y");
  EXPECT_TRUE(*m.a_in_b_topk);
  EXPECT_TRUE(*m.b_in_a_topk);
  EXPECT_TRUE(*m.consistent);
  EXPECT_DOUBLE_EQ(*m.token_agreement, 3.0 / 4.0);  // positions 0, 1, 3
  // Same-context positions 0..2: top-1 agrees at 0 and 1, not at 2.
  EXPECT_DOUBLE_EQ(*m.top1_agreement, 2.0 / 3.0);
  EXPECT_EQ(m.logprob_positions, 2);
  EXPECT_NEAR(*m.mean_logprob_diff, 0.2, 1e-12);
  EXPECT_NEAR(*m.max_logprob_diff, 0.3, 1e-12);
  EXPECT_NEAR(m.similarity, 0.75, 1e-12);  // "abxz" vs "abyz": one substitution in 4
}

TEST(CompareMetricsTest, DivergenceOutsideTopKAndEarlyStop) {
  auto a = Completion({Tok("a", -1, {"a"}), Tok("x", -1, {"x", "q"})});
  auto b = Completion({Tok("a", -1, {"a"}), Tok("y", -1, {"y", "x"})});
  PairMetrics m = ComparePair(a, b);
  EXPECT_TRUE(*m.a_in_b_topk);
  EXPECT_FALSE(*m.b_in_a_topk);
  EXPECT_FALSE(*m.consistent);

  // B stops after "a" while A goes on: divergence at 1, A's token named, not consistent.
  auto c = Completion({Tok("a", -1, {"a"})});
  m = ComparePair(a, c);
  EXPECT_EQ(m.first_divergence, 1);
  EXPECT_EQ(m.token_a, "x");
  EXPECT_EQ(m.token_b, "");
  EXPECT_FALSE(*m.consistent);
  EXPECT_DOUBLE_EQ(*m.token_agreement, 0.5);
}

TEST(CompareMetricsTest, WithoutLogprobsOnlyTextMetrics) {
  CompareCompletion a, b;
  a.text = "kitten";
  b.text = "sitting";
  const PairMetrics m = ComparePair(a, b);
  EXPECT_FALSE(m.exact);
  EXPECT_FALSE(m.has_tokens);
  EXPECT_EQ(m.first_divergence, -1);
  EXPECT_EQ(m.first_divergence_char, 0);
  EXPECT_FALSE(m.token_agreement.has_value());
  EXPECT_FALSE(m.consistent.has_value());
  EXPECT_NEAR(m.similarity, 1.0 - 3.0 / 7.0, 1e-12);  // Levenshtein 3
  EXPECT_DOUBLE_EQ(TextSimilarity("", ""), 1.0);
  EXPECT_DOUBLE_EQ(TextSimilarity("abc", ""), 0.0);
  EXPECT_DOUBLE_EQ(TextSimilarity("abcdef", "abcxyz", 3), 1.0);  // compared on 3 bytes
}

TEST(CompareMetricsTest, SummaryAndChecks) {
  auto same = Completion({Tok("a", -1, {"a", "b"}), Tok("b", -2, {"b", "c"})});
  auto near = Completion({Tok("a", -1.5, {"a", "b"}), Tok("c", -2, {"c", "b"})});
  auto far = Completion({Tok("q", -1, {"q"})});
  std::vector<PairMetrics> runs = {ComparePair(same, same), ComparePair(same, near),
                                   ComparePair(same, far)};
  const ModeSummary s = Summarize(runs);
  EXPECT_EQ(s.runs, 3);
  EXPECT_EQ(s.exact, 1);
  EXPECT_NEAR(s.exact_match_rate, 1.0 / 3, 1e-12);
  EXPECT_EQ(s.diverged_with_topk, 2);
  EXPECT_EQ(s.diverged_in_topk, 1);  // "b" vs "c": each in the other's top-k
  EXPECT_NEAR(*s.consistent_rate, 2.0 / 3, 1e-12);
  // Compared positions: 2 (identical, diff 0) + 1 (diff 0.5) -> mean 1/6, max 0.5.
  EXPECT_NEAR(*s.mean_logprob_diff, 0.5 / 3, 1e-12);
  EXPECT_NEAR(*s.max_logprob_diff, 0.5, 1e-12);
  EXPECT_NEAR(*s.mean_first_divergence, 0.5, 1e-12);  // 1 and 0

  CompareThresholds t;
  t.min_consistent = 0.6;
  t.max_logprob_diff = 0.4;
  t.min_sampled_exact_match = 1.0;
  const auto checks = RunChecks(t, s, ModeSummary());
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].name, "min-consistent");
  EXPECT_TRUE(checks[0].pass);
  EXPECT_EQ(checks[1].name, "max-logprob-diff");
  EXPECT_FALSE(checks[1].pass);
  EXPECT_EQ(checks[2].name, "min-sampled-exact-match");
  EXPECT_FALSE(checks[2].pass);  // no sampled runs: not measured, so not passed
  EXPECT_FALSE(checks[2].note.empty());
}

TEST(CompareMetricsTest, UnknownTopKCannotPassConsistency) {
  CompareCompletion a, b;
  a.text = "x";
  b.text = "y";
  const ModeSummary s = Summarize({ComparePair(a, b)});
  EXPECT_FALSE(s.consistent_rate.has_value());
  CompareThresholds t;
  t.min_consistent = 0.0;
  const auto checks = RunChecks(t, s, ModeSummary());
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_FALSE(checks[0].pass);
  EXPECT_NE(checks[0].note.find("top_logprobs"), std::string::npos);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  std::ofstream(p) << text;
  return p.string();
}

TEST(ComparePromptsTest, ReadsPromptsAndMessages) {
  const std::string path = WriteTemp(
      "dh_compare_prompts.jsonl",
      "{\"prompt\": \"ROMEO:\"}\n\n{\"id\": \"chat-1\", \"messages\": [{\"role\": \"user\", "
      "\"content\": \"hi\"}]}\n{\"id\": 7, \"prompt\": \"x\"}\n");
  auto p = ReadComparePrompts(path);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_FALSE((*p)[0].chat);
  EXPECT_EQ((*p)[0].id, "line 1");
  EXPECT_EQ((*p)[0].prompt, "ROMEO:");
  EXPECT_TRUE((*p)[1].chat);
  EXPECT_EQ((*p)[1].id, "chat-1");
  EXPECT_EQ((*p)[1].line, 3);
  EXPECT_EQ((*p)[2].id, "7");
  fs::remove(path);
}

TEST(ComparePromptsTest, BadLinesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"a\"}\n{oops\n", ":2: not valid JSON"},
      {"[1, 2]\n", ":1: expected an object with either \"prompt\""},
      {"{\"prompt\": \"a\", \"messages\": []}\n", ":1: expected an object with either"},
      {"{\"prompt\": 3}\n", ":1: \"prompt\": expected a non-empty string"},
      {"{\"messages\": []}\n", ":1: \"messages\": expected a non-empty array"},
      {"{\"messages\": [{\"content\": \"x\"}]}\n", ":1: \"messages\"[0]: expected an object"},
      {"{\"id\": [1], \"prompt\": \"a\"}\n", ":1: \"id\": expected a string or an integer"},
      {"\n\n", ": no prompts"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string path = WriteTemp("dh_compare_bad.jsonl", text);
    auto p = ReadComparePrompts(path);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(path + expected), std::string::npos)
        << p.status().message();
    fs::remove(path);
  }
  auto missing = ReadComparePrompts("/nonexistent/prompts.jsonl");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/prompts.jsonl"), std::string::npos);
}

TEST(CompareTargetTest, UrlsAndLocalSpecs) {
  auto url = ParseCompareTarget("http://127.0.0.1:8000/v1,name=ds", "--a");
  ASSERT_TRUE(url.ok()) << url.status().message();
  EXPECT_FALSE(url->local);
  EXPECT_EQ(url->url, "http://127.0.0.1:8000/v1");
  EXPECT_EQ(url->model_name, "ds");
  auto local = ParseCompareTarget("model=models/x,device=reference,quant=int4,tp=1,threads=2", "--b");
  ASSERT_TRUE(local.ok()) << local.status().message();
  EXPECT_TRUE(local->local);
  EXPECT_EQ(local->model_path, "models/x");
  EXPECT_EQ(local->device, "reference");
  EXPECT_EQ(local->quant, "int4");
  EXPECT_EQ(local->threads, 2);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "--a: expected a URL"},
      {"https://x", "--a: 'https://x': expected http://HOST:PORT"},
      {"http://", "--a: 'http://': expected http://HOST:PORT"},
      {"http://h:1,model=x", "--a: 'model': a URL target takes only name="},
      {"device=cpu", "--a: 'device=cpu': expected an http:// URL or a spec with model=DIR"},
      {"model=d,color=red", "--a: 'color': unknown key"},
      {"model=d,tp=x", "--a: tp=x: expected a non-negative integer"},
      {"model=d,tp=0", "--a: tp=0: expected 1 to 64 ranks"},
      {"model=d,tp=65", "--a: tp=65: expected 1 to 64 ranks"},
      {"model=d,quant", "--a: 'quant': expected KEY=VALUE"},
      {"model=", "--a: model: expected a value"},
  };
  for (const auto& [text, expected] : bad) {
    auto r = ParseCompareTarget(text, "--a");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(expected), std::string::npos) << r.status().message();
  }
}

TEST(CompareOptionsTest, RangesAreChecked) {
  CompareOptions o;
  EXPECT_TRUE(CheckCompareOptions(o).ok());
  o.max_tokens = 0;
  EXPECT_NE(CheckCompareOptions(o).message().find("--max-tokens"), std::string::npos);
  o = CompareOptions();
  o.top_logprobs = 21;
  EXPECT_NE(CheckCompareOptions(o).message().find("--top-logprobs"), std::string::npos);
  o = CompareOptions();
  o.temperature = 0;
  EXPECT_NE(CheckCompareOptions(o).message().find("--temperature"), std::string::npos);
  o = CompareOptions();
  o.samples = -1;
  EXPECT_NE(CheckCompareOptions(o).message().find("--samples"), std::string::npos);
}

TEST(CompareReportTest, MarkdownShowsWhereItDiverges) {
  ComparePrompt p;
  p.line = 1;
  p.id = "p1";
  p.prompt = "ROMEO:";
  CompareResult r;
  r.model_a = "A";
  r.model_b = "B";
  ComparePromptResult pr;
  pr.prompt = &p;
  CompareRun run;
  run.mode = "greedy";
  run.a = Completion({Tok("Good", -1, {"Good", "Bad"}), Tok(" night", -1, {" night"})});
  run.b = Completion({Tok("Good", -1, {"Good", "Bad"}), Tok(" day|", -1, {" day|"})});
  run.metrics = ComparePair(run.a, run.b);
  pr.runs.push_back(run);
  r.prompts.push_back(pr);
  r.greedy = Summarize({run.metrics});
  CompareOptions o;
  o.samples = 0;
  CompareTargetSpec ta, tb;
  ta.text = "http://a";
  tb.text = "model=x";
  tb.local = true;
  CompareReportInput in;
  in.result = &r;
  in.options = &o;
  in.a = &ta;
  in.b = &tb;
  in.prompts_file = "p.jsonl";
  CompareThresholds t;
  t.min_consistent = 1.0;
  in.checks = RunChecks(t, r.greedy, r.sampled);
  in.pass = in.checks[0].pass;
  EXPECT_FALSE(in.pass);
  const std::string md = CompareReportMarkdown(in);
  EXPECT_NE(md.find("**Result: FAIL**"), std::string::npos) << md;
  EXPECT_NE(md.find("| min-consistent | 0.0000 | ≥ 1 | **FAIL** |"), std::string::npos) << md;
  // The divergence: at token 1 after "Good", A " night" vs B " day|" ('|' escaped).
  EXPECT_NE(md.find("token 1: `Good` then A ` night` / B ` day\\|`"), std::string::npos) << md;
  const std::string text = CompareReportText(in);
  EXPECT_NE(text.find("\ngreedy "), std::string::npos) << text;
  EXPECT_NE(text.find(" 0/1 "), std::string::npos) << text;
  EXPECT_NE(text.find("result: FAIL"), std::string::npos) << text;
  const nlohmann::json j = CompareReportJson(in);
  EXPECT_FALSE(j["pass"].get<bool>());
  EXPECT_EQ(j["prompts"][0]["runs"][0]["first_divergence"], 1);
  EXPECT_EQ(j["prompts"][0]["runs"][0]["token_b_at_divergence"], " day|");
  EXPECT_EQ(j["b"]["kind"], "local");
  EXPECT_EQ(j["overall"]["greedy"]["exact"], 0);
}

}  // namespace
}  // namespace dh::tools
