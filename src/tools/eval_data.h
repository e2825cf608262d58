// Datasets of `deepharness eval` in their published file layouts (users download them): MMLU
// `data/{dev,test}/<subject>_{dev,test}.csv` (no header), CMMLU `{dev,test}/<subject>.csv`
// (header), C-Eval `{dev,val}/<subject>_{dev,val}.csv` (header id,question,A-D,answer,
// explanation) and GSM8K `test.jsonl`. Every error names the file (and line) and what was expected.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh::tools {

// RFC 4180 CSV: fields separated by ',', optionally quoted with '"' ('""' inside quotes is one
// quote; quoted fields may hold commas and newlines), records end at LF or CRLF. A UTF-8 BOM at the
// start is skipped. Every record must have `num_fields` fields (0: any). `name` is used in errors.
Result<std::vector<std::vector<std::string>>> ParseCsv(std::string_view text,
                                                       const std::string& name,
                                                       size_t num_fields = 0);

// One four-option question. `gold` is 0-3.
struct McItem {
  std::string question;
  std::array<std::string, 4> choices;
  int gold = 0;
};

struct McSubject {
  std::string name;          // file stem, e.g. abstract_algebra
  std::vector<McItem> dev;   // few-shot pool, in file order (lm-eval's first_n sampler)
  std::vector<McItem> eval;  // the evaluated split
};

enum class McTask { kMmlu, kCmmlu, kCeval };
const char* McTaskName(McTask task);

// Loads every subject of `task` under `dir`, sorted by name. MMLU accepts the `data/` folder or the
// folder holding it. `eval` is MMLU/CMMLU `test` and C-Eval `val` (its test answers are hidden).
Result<std::vector<McSubject>> LoadMcTask(McTask task, const std::string& dir);

struct GsmItem {
  std::string question;
  std::string answer;  // the full solution ending in "#### N"
};

// Parses GSM8K JSONL text (one {"question","answer"} object per line; blank lines skipped).
Result<std::vector<GsmItem>> ParseGsm8kJsonl(std::string_view text, const std::string& name);
// Loads `dir`/test.jsonl.
Result<std::vector<GsmItem>> LoadGsm8k(const std::string& dir);

}  // namespace dh::tools
