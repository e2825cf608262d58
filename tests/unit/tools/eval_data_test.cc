// eval's file layouts (CSV quoting, BOM, CRLF, Chinese text), prompt templates against
// hand-written prompts, GSM8K answer extraction and the McNemar test.
#include "tools/eval_data.h"

#include <gtest/gtest.h>

#include <string>

#include "tools/eval_compare.h"
#include "tools/eval_tasks.h"

namespace dh::tools {
namespace {

const std::string kData = std::string(DH_SOURCE_DIR) + "/tests/unit/tools/data/eval";

TEST(EvalCsv, QuotingCrLfBomAndBlankLines) {
  auto rows = ParseCsv(
      "\xEF\xBB\xBF"
      "a,\"b,c\",\"say \"\"hi\"\"\"\r\n\r\n\"two\nlines\",,x\n",
      "t.csv", 3);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0][0], "a");
  EXPECT_EQ((*rows)[0][1], "b,c");
  EXPECT_EQ((*rows)[0][2], "say \"hi\"");
  EXPECT_EQ((*rows)[1][0], "two\nlines");
  EXPECT_EQ((*rows)[1][1], "");
  EXPECT_EQ((*rows)[1][2], "x");
}

TEST(EvalCsv, ErrorsNameTheFileAndLine) {
  auto bad = ParseCsv("a,b\n\"open,c\n", "f.csv", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "f.csv: line 2: unterminated quoted field");
  auto count = ParseCsv("a,b,c\nd,e\n", "g.csv", 3);
  ASSERT_FALSE(count.ok());
  EXPECT_EQ(count.status().message(), "g.csv: line 2: expected 3 fields, got 2");
  auto junk = ParseCsv("\"a\"b,c\n", "h.csv", 0);
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("h.csv: line 1"), std::string::npos);
}

TEST(EvalData, MmluLayoutAcceptsDataOrItsParent) {
  for (const std::string& dir : std::vector<std::string>{kData + "/mmlu", kData + "/mmlu/data"}) {
    auto subjects = LoadMcTask(McTask::kMmlu, dir);
    ASSERT_TRUE(subjects.ok()) << subjects.status().message();
    ASSERT_EQ(subjects->size(), 2u);
    const McSubject& s = (*subjects)[0];
    EXPECT_EQ(s.name, "abstract_algebra");
    ASSERT_EQ(s.eval.size(), 3u);
    ASSERT_EQ(s.dev.size(), 2u);
    EXPECT_EQ(s.eval[1].question, "A question that spans\r\ntwo lines, with a comma");
    EXPECT_EQ(s.eval[1].choices[2], "say \"maybe\"");
    EXPECT_EQ(s.eval[1].choices[3], "  spaced  ");
    EXPECT_EQ(s.eval[1].gold, 1);
    EXPECT_EQ(s.dev[1].question, "Which of these, if any, is a group under \"+\"?");
    EXPECT_EQ(s.dev[1].choices[2], "The set {1, 2}");
    EXPECT_EQ((*subjects)[1].name, "high_school_geography");
  }
}

TEST(EvalData, CmmluAndCevalHeadersAndChinese) {
  auto cmmlu = LoadMcTask(McTask::kCmmlu, kData + "/cmmlu");
  ASSERT_TRUE(cmmlu.ok()) << cmmlu.status().message();
  ASSERT_EQ(cmmlu->size(), 1u);
  EXPECT_EQ((*cmmlu)[0].name, "agronomy");
  EXPECT_EQ((*cmmlu)[0].dev[1].question, "下列说法，正确的是\"哪一个\"？");
  EXPECT_EQ((*cmmlu)[0].eval[0].choices[2], "非洲,北部");
  EXPECT_EQ((*cmmlu)[0].eval[0].gold, 1);
  auto ceval = LoadMcTask(McTask::kCeval, kData + "/ceval");
  ASSERT_TRUE(ceval.ok()) << ceval.status().message();
  EXPECT_EQ((*ceval)[0].name, "computer_network");
  ASSERT_EQ((*ceval)[0].eval.size(), 2u);  // the val split is evaluated
  EXPECT_EQ((*ceval)[0].eval[1].question, "HTTP 默认端口是\n多少？");
  EXPECT_EQ((*ceval)[0].eval[1].gold, 2);
}

TEST(EvalData, MissingAndMalformedFilesNameTheFile) {
  auto none = LoadMcTask(McTask::kCeval, kData + "/mmlu");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find(kData + "/mmlu/val: no such folder"), std::string::npos)
      << none.status().message();
  auto gsm = LoadGsm8k(kData + "/mmlu");
  ASSERT_FALSE(gsm.ok());
  EXPECT_NE(gsm.status().message().find("mmlu/test.jsonl"), std::string::npos);
  auto bad_json =
      ParseGsm8kJsonl("{\"question\": \"q\", \"answer\": \"#### 1\"}\n{oops\n", "t.jsonl");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.status().message(), "t.jsonl: line 2: expected a JSON object");
  auto no_hashes = ParseGsm8kJsonl("{\"question\": \"q\", \"answer\": \"7\"}\n", "u.jsonl");
  ASSERT_FALSE(no_hashes.ok());
  EXPECT_NE(no_hashes.status().message().find("u.jsonl: line 1: answer"), std::string::npos);
}

TEST(EvalData, Gsm8kJsonl) {
  auto items = LoadGsm8k(kData + "/gsm8k");
  ASSERT_TRUE(items.ok()) << items.status().message();
  ASSERT_EQ(items->size(), 3u);  // the blank line is skipped
  EXPECT_EQ(GsmTarget((*items)[1].answer), "2,400");
  EXPECT_EQ(GsmTarget((*items)[2].answer), "-5");
}

TEST(EvalPrompts, MmluOneShotMatchesLmEval) {
  auto subjects = LoadMcTask(McTask::kMmlu, kData + "/mmlu");
  ASSERT_TRUE(subjects.ok());
  const McSubject& s = (*subjects)[0];
  const std::string expected =
      "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
      "Find the degree of the extension Q(sqrt(2)) over Q.\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer: C\n\n"
      "Let p = (1, 2, 5, 4)(2, 3) in S_5. Find the index of <p> in S_5.\nA. 8\nB. 2\nC. 24\nD. "
      "120\nAnswer:";
  EXPECT_EQ(McPrompt(McTask::kMmlu, s.name, s.dev, 1, s.eval[0]), expected);
  // k larger than dev: all of dev, in file order.
  const std::string two = McPrompt(McTask::kMmlu, s.name, s.dev, 5, s.eval[2]);
  EXPECT_NE(two.find("Answer: C\n\nWhich of these, if any, is a group under \"+\"?\nA. The "
                     "integers\nB. The odd integers\nC. The set {1, 2}\nD. None of them\nAnswer: "
                     "A\n\nIs 7 prime?"),
            std::string::npos);
  EXPECT_EQ(McPrompt(McTask::kMmlu, s.name, s.dev, 0, s.eval[1]),
            "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
            "A question that spans\r\ntwo lines, with a comma\nA. yes\nB. no\nC. say \"maybe\"\nD. "
            "  spaced  \nAnswer:");
}

TEST(EvalPrompts, CmmluAndCevalMatchLmEval) {
  auto cmmlu = LoadMcTask(McTask::kCmmlu, kData + "/cmmlu");
  ASSERT_TRUE(cmmlu.ok());
  const McSubject& c = (*cmmlu)[0];
  // The question's full-width spaces are stripped like Python's str.strip().
  EXPECT_EQ(McPrompt(McTask::kCmmlu, c.name, c.dev, 1, c.eval[1]),
            "以下是关于农学的单项选择题，请直接给出正确答案的选项。\n\n"
            "水稻属于哪一科？\nA. 禾本科\nB. 豆科\nC. 菊科\nD. 十字花科\n答案： A\n\n"
            "玉米是几月播种？\nA. 一月\nB. 四月\nC. 八月\nD. 十二月\n答案：");
  auto ceval = LoadMcTask(McTask::kCeval, kData + "/ceval");
  ASSERT_TRUE(ceval.ok());
  const McSubject& e = (*ceval)[0];
  EXPECT_EQ(McPrompt(McTask::kCeval, e.name, e.dev, 0, e.eval[0]),
            "以下是中国关于计算机网络的单项选择题，请选出其中的正确答案。\n\n"
            "IP 地址有多少位？\nA. 16\nB. 32\nC. 64\nD. 128\n答案：");
  EXPECT_EQ(SubjectCategory(McTask::kCeval, "computer_network"), "STEM");
  EXPECT_EQ(SubjectCategory(McTask::kMmlu, "high_school_geography"), "social_sciences");
  EXPECT_EQ(SubjectDisplayName(McTask::kCmmlu, "not_a_subject"), "not_a_subject");
}

TEST(EvalPrompts, Gsm8kChainOfThought) {
  EXPECT_EQ(GsmPrompt("How many?", 0), "Q: How many?\nA:");
  EXPECT_EQ(
      GsmPrompt("How many?", 1),
      "Q: There are 15 trees in the grove. Grove workers will plant trees in the grove today. "
      "After they are done, there will be 21 trees. How many trees did the grove workers "
      "plant today?\nA: There are 15 trees originally. Then there were 21 trees after some "
      "more were planted. So there must have been 21 - 15 = 6. The answer is 6.\n\n"
      "Q: How many?\nA:");
  const std::string eight = GsmPrompt("X", 8);
  size_t shots = 0;
  for (size_t p = eight.find("The answer is"); p != std::string::npos;
       p = eight.find("The answer is", p + 1))
    ++shots;
  EXPECT_EQ(shots, 8u);
  EXPECT_NE(eight.find("23 - 15 is 8. The answer is 8.\n\nQ: X\nA:"), std::string::npos);
  EXPECT_EQ(GsmPrompt("X", 99), eight);
  EXPECT_EQ(GsmStopSequences(), (std::vector<std::string>{"Q:", "</s>", "<|im_end|>"}));
}

TEST(EvalGsm8k, StrictFilter) {
  EXPECT_EQ(GsmStrictExtract("So 3 + 4 = 7. The answer is 7."), "7");
  EXPECT_EQ(GsmStrictExtract("The answer is 1,234.\nThe answer is 5."), "1,234");  // first match
  // Greedy class then any character: the period is kept here (the normalizer drops it later).
  EXPECT_EQ(GsmStrictExtract("The answer is -5. Done"), "-5.");
  EXPECT_EQ(GsmStrictExtract("The answer is $18."), "[invalid]");  // '$' is not in the class
  EXPECT_EQ(GsmStrictExtract("the answer is 4."), "[invalid]");    // the regex is case-sensitive
  // lm-eval's trailing '.' needs one more character: at the very end it takes the last digit.
  EXPECT_EQ(GsmStrictExtract("The answer is 72"), "7");
  EXPECT_EQ(GsmStrictExtract("The answer is 3.5 apples"), "3.5");
}

TEST(EvalGsm8k, FlexibleFilter) {
  EXPECT_EQ(GsmFlexibleExtract("She paid $1,234.50 in total, so 18 left."), "18");
  EXPECT_EQ(GsmFlexibleExtract("The result is 42."), "42.");
  EXPECT_EQ(GsmFlexibleExtract("It is -3 degrees"), "-3");
  EXPECT_EQ(GsmFlexibleExtract("costs $5"), "$5");
  EXPECT_EQ(GsmFlexibleExtract("first 5,000, then 7"), "7");
  EXPECT_EQ(GsmFlexibleExtract("no numbers here"), "[invalid]");
  EXPECT_EQ(GsmFlexibleExtract("the answer is 9\n\n"), "9");
}

TEST(EvalGsm8k, ExactMatchNormalization) {
  EXPECT_TRUE(GsmExactMatch("1,234", "1234"));
  EXPECT_TRUE(GsmExactMatch("$5", "5"));
  EXPECT_TRUE(GsmExactMatch("42.", "42"));
  EXPECT_TRUE(GsmExactMatch("-5", "-5"));
  EXPECT_TRUE(GsmExactMatch("2,400", GsmTarget("1,200 * 2 = 2,400\n#### 2,400")));
  EXPECT_FALSE(GsmExactMatch("1234.00", "1234"));  // no numeric equivalence, as in lm-eval
  EXPECT_FALSE(GsmExactMatch("[invalid]", "7"));
  EXPECT_FALSE(GsmExactMatch("-5", "5"));
  EXPECT_EQ(GsmNormalize("Step 1\n#### 72"), "72");
}

TEST(EvalCompare, McNemarExact) {
  EXPECT_DOUBLE_EQ(McNemarExactP(0, 0), 1.0);
  EXPECT_NEAR(McNemarExactP(10, 0), 2.0 / 1024, 1e-12);
  EXPECT_NEAR(McNemarExactP(0, 10), 2.0 / 1024, 1e-12);
  EXPECT_DOUBLE_EQ(McNemarExactP(5, 5), 1.0);
  EXPECT_NEAR(McNemarExactP(3, 10), 2.0 * (1 + 13 + 78 + 286) / 8192, 1e-12);
  // Large n stays finite and symmetric.
  EXPECT_NEAR(McNemarExactP(1000, 1100), McNemarExactP(1100, 1000), 1e-12);
  EXPECT_LT(McNemarExactP(1000, 1100), 0.05);
}

TEST(EvalCompare, PairsItemsByKey) {
  using Json = nlohmann::json;
  Json a = {{"config", Json::object()}, {"items", Json::array()}};
  Json b = a;
  for (int i = 0; i < 20; ++i) {
    const std::string key = "mmlu/x/" + std::to_string(i);
    a["items"].push_back({{"key", key}, {"task", "mmlu"}, {"correct", true}});
    b["items"].push_back({{"key", key}, {"task", "mmlu"}, {"correct", i >= 12}});  // B loses 12
  }
  a["items"].push_back({{"key", "gsm8k/0"},
                        {"task", "gsm8k"},
                        {"strict_correct", true},
                        {"flexible_correct", false}});
  b["items"].push_back({{"key", "gsm8k/0"},
                        {"task", "gsm8k"},
                        {"strict_correct", true},
                        {"flexible_correct", true}});
  b["items"].push_back({{"key", "gsm8k/1"},
                        {"task", "gsm8k"},
                        {"strict_correct", true},
                        {"flexible_correct", true}});
  const auto rows = CompareReports(a, b);
  ASSERT_EQ(rows.size(), 3u);
  const CompareRow* mmlu = nullptr;
  for (const auto& r : rows)
    if (r.task == "mmlu") mmlu = &r;
  ASSERT_NE(mmlu, nullptr);
  EXPECT_EQ(mmlu->n, 20);
  EXPECT_DOUBLE_EQ(mmlu->acc_a, 1.0);
  EXPECT_DOUBLE_EQ(mmlu->acc_b, 0.4);
  EXPECT_EQ(mmlu->only_a, 12);
  EXPECT_EQ(mmlu->only_b, 0);
  EXPECT_NEAR(mmlu->p_value, 2.0 / 4096, 1e-12);
  for (const auto& r : rows) {
    if (r.task != "gsm8k") continue;
    EXPECT_EQ(r.n, 1);
    EXPECT_EQ(r.unmatched, 1);  // gsm8k/1 is only in B
  }
}

}  // namespace
}  // namespace dh::tools
