// Templates and tables of eval_tasks.h, written from lm-eval's task YAMLs (mmlu/default,
// cmmlu, ceval-valid, gsm8k-cot) so scores compare with published lm-eval numbers.
#include "tools/eval_tasks.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <map>
#include <memory>
#include <utility>

#include "base/check.h"

namespace dh::tools {
namespace {

struct SubjectInfo {
  const char* display;
  const char* category;
};

// MMLU subject -> category (lm-eval mmlu groups).
const std::map<std::string, std::string>& MmluCategories() {
  static const std::map<std::string, std::string> table = [] {
    std::map<std::string, std::string> t;
    const std::pair<const char*, std::vector<const char*>> groups[] = {
        {"stem",
         {"abstract_algebra", "anatomy", "astronomy", "college_biology", "college_chemistry",
          "college_computer_science", "college_mathematics", "college_physics", "computer_security",
          "conceptual_physics", "electrical_engineering", "elementary_mathematics",
          "high_school_biology", "high_school_chemistry", "high_school_computer_science",
          "high_school_mathematics", "high_school_physics", "high_school_statistics",
          "machine_learning"}},
        {"humanities",
         {"formal_logic", "high_school_european_history", "high_school_us_history",
          "high_school_world_history", "international_law", "jurisprudence", "logical_fallacies",
          "moral_disputes", "moral_scenarios", "philosophy", "prehistory", "professional_law",
          "world_religions"}},
        {"social_sciences",
         {"econometrics", "high_school_geography", "high_school_government_and_politics",
          "high_school_macroeconomics", "high_school_microeconomics", "high_school_psychology",
          "human_sexuality", "professional_psychology", "public_relations", "security_studies",
          "sociology", "us_foreign_policy"}},
        {"other",
         {"business_ethics", "clinical_knowledge", "college_medicine", "global_facts",
          "human_aging", "management", "marketing", "medical_genetics", "miscellaneous",
          "nutrition", "professional_accounting", "professional_medicine", "virology"}},
    };
    for (const auto& [category, subjects] : groups)
      for (const char* s : subjects) t[s] = category;
    return t;
  }();
  return table;
}

const std::map<std::string, SubjectInfo>& CmmluSubjects() {
  static const std::map<std::string, SubjectInfo> table = {
      {"agronomy", {"农学", ""}},
      {"anatomy", {"解剖学", ""}},
      {"ancient_chinese", {"古汉语", ""}},
      {"arts", {"艺术学", ""}},
      {"astronomy", {"天文学", ""}},
      {"business_ethics", {"商业伦理", ""}},
      {"chinese_civil_service_exam", {"中国公务员考试", ""}},
      {"chinese_driving_rule", {"中国驾驶规则", ""}},
      {"chinese_food_culture", {"中国饮食文化", ""}},
      {"chinese_foreign_policy", {"中国外交政策", ""}},
      {"chinese_history", {"中国历史", ""}},
      {"chinese_literature", {"中国文学", ""}},
      {"chinese_teacher_qualification", {"中国教师资格", ""}},
      {"clinical_knowledge", {"临床知识", ""}},
      {"college_actuarial_science", {"大学精算学", ""}},
      {"college_education", {"大学教育学", ""}},
      {"college_engineering_hydrology", {"大学工程水文学", ""}},
      {"college_law", {"大学法律", ""}},
      {"college_mathematics", {"大学数学", ""}},
      {"college_medical_statistics", {"大学医学统计", ""}},
      {"college_medicine", {"大学医学", ""}},
      {"computer_science", {"计算机科学", ""}},
      {"computer_security", {"计算机安全", ""}},
      {"conceptual_physics", {"概念物理学", ""}},
      {"construction_project_management", {"建设工程管理", ""}},
      {"economics", {"经济学", ""}},
      {"education", {"教育学", ""}},
      {"electrical_engineering", {"电气工程", ""}},
      {"elementary_chinese", {"小学语文", ""}},
      {"elementary_commonsense", {"小学常识", ""}},
      {"elementary_information_and_technology", {"小学信息技术", ""}},
      {"elementary_mathematics", {"初等数学", ""}},
      {"ethnology", {"民族学", ""}},
      {"food_science", {"食品科学", ""}},
      {"genetics", {"遗传学", ""}},
      {"global_facts", {"全球事实", ""}},
      {"high_school_biology", {"高中生物", ""}},
      {"high_school_chemistry", {"高中化学", ""}},
      {"high_school_geography", {"高中地理", ""}},
      {"high_school_mathematics", {"高中数学", ""}},
      {"high_school_physics", {"高中物理学", ""}},
      {"high_school_politics", {"高中政治", ""}},
      {"human_sexuality", {"人类性行为", ""}},
      {"international_law", {"国际法学", ""}},
      {"journalism", {"新闻学", ""}},
      {"jurisprudence", {"法理学", ""}},
      {"legal_and_moral_basis", {"法律与道德基础", ""}},
      {"logical", {"逻辑学", ""}},
      {"machine_learning", {"机器学习", ""}},
      {"management", {"管理学", ""}},
      {"marketing", {"市场营销", ""}},
      {"marxist_theory", {"马克思主义理论", ""}},
      {"modern_chinese", {"现代汉语", ""}},
      {"nutrition", {"营养学", ""}},
      {"philosophy", {"哲学", ""}},
      {"professional_accounting", {"专业会计", ""}},
      {"professional_law", {"专业法学", ""}},
      {"professional_medicine", {"专业医学", ""}},
      {"professional_psychology", {"专业心理学", ""}},
      {"public_relations", {"公共关系", ""}},
      {"security_study", {"安全研究", ""}},
      {"sociology", {"社会学", ""}},
      {"sports_science", {"体育学", ""}},
      {"traditional_chinese_medicine", {"中医中药", ""}},
      {"virology", {"病毒学", ""}},
      {"world_history", {"世界历史", ""}},
      {"world_religions", {"世界宗教", ""}},
  };
  return table;
}

// C-Eval subjects with the categories of C-Eval's subject_mapping.
const std::map<std::string, SubjectInfo>& CevalSubjects() {
  static const std::map<std::string, SubjectInfo> table = {
      {"computer_network", {"计算机网络", "STEM"}},
      {"operating_system", {"操作系统", "STEM"}},
      {"computer_architecture", {"计算机组成", "STEM"}},
      {"college_programming", {"大学编程", "STEM"}},
      {"college_physics", {"大学物理", "STEM"}},
      {"college_chemistry", {"大学化学", "STEM"}},
      {"advanced_mathematics", {"高等数学", "STEM"}},
      {"probability_and_statistics", {"概率统计", "STEM"}},
      {"discrete_mathematics", {"离散数学", "STEM"}},
      {"electrical_engineer", {"注册电气工程师", "STEM"}},
      {"metrology_engineer", {"注册计量师", "STEM"}},
      {"high_school_mathematics", {"高中数学", "STEM"}},
      {"high_school_physics", {"高中物理", "STEM"}},
      {"high_school_chemistry", {"高中化学", "STEM"}},
      {"high_school_biology", {"高中生物", "STEM"}},
      {"middle_school_mathematics", {"初中数学", "STEM"}},
      {"middle_school_biology", {"初中生物", "STEM"}},
      {"middle_school_physics", {"初中物理", "STEM"}},
      {"middle_school_chemistry", {"初中化学", "STEM"}},
      {"veterinary_medicine", {"兽医学", "STEM"}},
      {"college_economics", {"大学经济学", "Social Science"}},
      {"business_administration", {"工商管理", "Social Science"}},
      {"marxism", {"马克思主义基本原理", "Social Science"}},
      {"mao_zedong_thought", {"毛泽东思想和中国特色社会主义理论体系概论", "Social Science"}},
      {"education_science", {"教育学", "Social Science"}},
      {"teacher_qualification", {"教师资格", "Social Science"}},
      {"high_school_politics", {"高中政治", "Social Science"}},
      {"high_school_geography", {"高中地理", "Social Science"}},
      {"middle_school_politics", {"初中政治", "Social Science"}},
      {"middle_school_geography", {"初中地理", "Social Science"}},
      {"modern_chinese_history", {"近代史纲要", "Humanities"}},
      {"ideological_and_moral_cultivation", {"思想道德修养与法律基础", "Humanities"}},
      {"logic", {"逻辑学", "Humanities"}},
      {"law", {"法学", "Humanities"}},
      {"chinese_language_and_literature", {"中国语言文学", "Humanities"}},
      {"art_studies", {"艺术学", "Humanities"}},
      {"professional_tour_guide", {"导游资格", "Humanities"}},
      {"legal_professional", {"法律职业资格", "Humanities"}},
      {"high_school_chinese", {"高中语文", "Humanities"}},
      {"high_school_history", {"高中历史", "Humanities"}},
      {"middle_school_history", {"初中历史", "Humanities"}},
      {"civil_servant", {"公务员", "Other"}},
      {"sports_science", {"体育学", "Other"}},
      {"plant_protection", {"植物保护", "Other"}},
      {"basic_medicine", {"基础医学", "Other"}},
      {"clinical_medicine", {"临床医学", "Other"}},
      {"urban_and_rural_planner", {"注册城乡规划师", "Other"}},
      {"accountant", {"注册会计师", "Other"}},
      {"fire_engineer", {"注册消防工程师", "Other"}},
      {"environmental_impact_assessment_engineer", {"环境影响评价工程师", "Other"}},
      {"tax_accountant", {"税务师", "Other"}},
      {"physician", {"医师资格", "Other"}},
  };
  return table;
}

// Python's str.isspace() set, as UTF-8 sequences (str.strip() in lm-eval's templates).
size_t SpaceLengthAt(const std::string& s, size_t i, bool backwards) {
  static const char* const kSpaces[] = {" ",
                                        "\t",
                                        "\n",
                                        "\v",
                                        "\f",
                                        "\r",
                                        "\x1c",
                                        "\x1d",
                                        "\x1e",
                                        "\x1f",
                                        "\xc2\x85",
                                        "\xc2\xa0",
                                        "\xe1\x9a\x80",
                                        "\xe2\x80\x80",
                                        "\xe2\x80\x81",
                                        "\xe2\x80\x82",
                                        "\xe2\x80\x83",
                                        "\xe2\x80\x84",
                                        "\xe2\x80\x85",
                                        "\xe2\x80\x86",
                                        "\xe2\x80\x87",
                                        "\xe2\x80\x88",
                                        "\xe2\x80\x89",
                                        "\xe2\x80\x8a",
                                        "\xe2\x80\xa8",
                                        "\xe2\x80\xa9",
                                        "\xe2\x80\xaf",
                                        "\xe2\x81\x9f",
                                        "\xe3\x80\x80"};
  for (const char* sp : kSpaces) {
    const size_t n = std::char_traits<char>::length(sp);
    if (!backwards && s.compare(i, n, sp) == 0) return n;
    if (backwards && i >= n && s.compare(i - n, n, sp) == 0) return n;
  }
  return 0;
}

std::string Strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    const size_t n = SpaceLengthAt(s, b, false);
    if (n == 0) break;
    b += n;
  }
  while (e > b) {
    const size_t n = SpaceLengthAt(s, e, true);
    if (n == 0) break;
    e -= n;
  }
  return s.substr(b, e - b);
}

struct GsmExemplar {
  const char* question;
  const char* target;
};

// The eight chain-of-thought exemplars of Wei et al. (2022) as gsm8k-cot.yaml lists them.
constexpr GsmExemplar kGsmExemplars[kGsmMaxFewshot] = {
    {"There are 15 trees in the grove. Grove workers will plant trees in the grove today. After "
     "they are done, there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So "
     "there must have been 21 - 15 = 6. The answer is 6."},
    {"If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the "
     "parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."},
    {"Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have "
     "left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. "
     "After eating 35, they had 74 - 35 = 39. The answer is 39."},
    {"Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many "
     "lollipops did Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave "
     "Denny 20 - 12 = 8. The answer is 8."},
    {"Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys "
     "does he have now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more "
     "toys. 5 + 4 = 9. The answer is 9."},
    {"There were nine computers in the server room. Five more computers were installed each day, "
     "from monday to thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * "
     "4 = 20 computers were added. 9 + 20 is 29. The answer is 29."},
    {"Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. "
     "How many golf balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After "
     "losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33."},
    {"Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has "
     "23 - 15 dollars left. 23 - 15 is 8. The answer is 8."},
};

// A compiled byte-mode PCRE2 pattern (the patterns are fixed ASCII; responses may be any bytes).
class Pattern {
 public:
  explicit Pattern(const char* pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, 0, &err,
                          &offset, nullptr);
    DH_CHECK(code_ != nullptr, "bad built-in pattern {}", pattern);
  }
  ~Pattern() { pcre2_code_free(code_); }

  // Python re.findall: per match, the first non-empty group of `groups` (or the whole match).
  std::vector<std::string> FindAll(const std::string& s) const {
    std::vector<std::string> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    PCRE2_SIZE start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                                 md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      std::string found;
      for (int g = 1; g < rc; ++g) {
        if (ov[2 * g] != PCRE2_UNSET && ov[2 * g + 1] > ov[2 * g]) {
          found = s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]);
          break;
        }
      }
      if (rc == 1) found = s.substr(ov[0], ov[1] - ov[0]);
      out.push_back(std::move(found));
      start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    }
    pcre2_match_data_free(md);
    return out;
  }

  // Python re.sub(pattern, "", s).
  std::string RemoveAll(const std::string& s) const {
    std::string out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    PCRE2_SIZE start = 0, copied = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                                 md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      out.append(s, copied, ov[0] - copied);
      copied = ov[1];
      start = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
    }
    out.append(s, copied, std::string::npos);
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

}  // namespace

std::string SubjectDisplayName(McTask task, const std::string& subject) {
  if (task == McTask::kMmlu) {
    std::string s = subject;
    for (char& c : s)
      if (c == '_') c = ' ';
    return s;
  }
  const auto& table = task == McTask::kCmmlu ? CmmluSubjects() : CevalSubjects();
  auto it = table.find(subject);
  return it == table.end() ? subject : it->second.display;
}

std::string SubjectCategory(McTask task, const std::string& subject) {
  if (task == McTask::kMmlu) {
    auto it = MmluCategories().find(subject);
    return it == MmluCategories().end() ? "" : it->second;
  }
  const auto& table = task == McTask::kCmmlu ? CmmluSubjects() : CevalSubjects();
  auto it = table.find(subject);
  return it == table.end() ? "" : it->second.category;
}

std::string McDescription(McTask task, const std::string& subject) {
  const std::string name = SubjectDisplayName(task, subject);
  switch (task) {
    case McTask::kMmlu:
      return "The following are multiple choice questions (with answers) about " + name + ".\n\n";
    case McTask::kCmmlu:
      return "以下是关于" + name + "的单项选择题，请直接给出正确答案的选项。\n\n";
    case McTask::kCeval:
      return "以下是中国关于" + name + "的单项选择题，请选出其中的正确答案。\n\n";
  }
  return "";
}

std::string McQueryText(McTask task, const McItem& item) {
  std::string s = Strip(item.question);
  for (int k = 0; k < 4; ++k) {
    s += '\n';
    s += static_cast<char>('A' + k);
    s += ". ";
    s += item.choices[k];
  }
  s += task == McTask::kMmlu ? "\nAnswer:" : "\n答案：";
  return s;
}

std::string McPrompt(McTask task, const std::string& subject, const std::vector<McItem>& dev,
                     int num_fewshot, const McItem& item) {
  std::string prompt = McDescription(task, subject);
  const size_t shots = std::min<size_t>(dev.size(), static_cast<size_t>(std::max(0, num_fewshot)));
  for (size_t i = 0; i < shots; ++i) {
    prompt += McQueryText(task, dev[i]);
    prompt += kTargetDelimiter;
    prompt += static_cast<char>('A' + dev[i].gold);
    prompt += kFewshotDelimiter;
  }
  prompt += McQueryText(task, item);
  return prompt;
}

std::string GsmPrompt(const std::string& question, int num_fewshot) {
  std::string prompt;
  const int shots = std::clamp(num_fewshot, 0, kGsmMaxFewshot);
  for (int i = 0; i < shots; ++i) {
    prompt += "Q: ";
    prompt += kGsmExemplars[i].question;
    prompt += "\nA:";
    prompt += kTargetDelimiter;
    prompt += kGsmExemplars[i].target;
    prompt += kFewshotDelimiter;
  }
  prompt += "Q: " + question + "\nA:";
  return prompt;
}

const std::vector<std::string>& GsmStopSequences() {
  static const std::vector<std::string> stops = {"Q:", "</s>", "<|im_end|>"};
  return stops;
}

std::string GsmTarget(const std::string& answer) {
  const size_t p = answer.rfind("####");
  return Strip(p == std::string::npos ? answer : answer.substr(p + 4));
}

std::string GsmStrictExtract(const std::string& response) {
  static const Pattern strict(R"(The answer is (\-?[0-9\.\,]+).)");
  auto found = strict.FindAll(response);
  return found.empty() ? "[invalid]" : Strip(found.front());
}

std::string GsmFlexibleExtract(const std::string& response) {
  static const Pattern flexible(R"((-?[$0-9.,]{2,})|(-?[0-9]+))");
  auto found = flexible.FindAll(response);
  return found.empty() ? "[invalid]" : Strip(found.back());
}

std::string GsmNormalize(const std::string& text) {
  static const Pattern comma(","), dollar(R"(\$)"), solution("(?s).*#### "), final_dot(R"(\.$)");
  std::string s = text;
  for (const Pattern* p : {&comma, &dollar, &solution, &final_dot}) s = p->RemoveAll(s);
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

bool GsmExactMatch(const std::string& prediction, const std::string& reference) {
  return GsmNormalize(prediction) == GsmNormalize(reference);
}

}  // namespace dh::tools
