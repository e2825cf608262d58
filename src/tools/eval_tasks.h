// The lm-evaluation-harness methods of `deepharness eval` (conventions.md §f): prompt templates,
// subject descriptions and categories, first_n few-shot selection, GSM8K chain-of-thought
// exemplars (gsm8k_cot), its strict/flexible answer filters and exact-match normalization.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "tools/eval_data.h"

namespace dh::tools {

// lm-eval's delimiters: between an example's text and its target, and between examples.
inline constexpr const char kTargetDelimiter[] = " ";
inline constexpr const char kFewshotDelimiter[] = "\n\n";

// The subject's display name used in the description: MMLU "abstract algebra", CMMLU/C-Eval the
// Chinese name of lm-eval's tables (the file stem when the subject is not in them).
std::string SubjectDisplayName(McTask task, const std::string& subject);
// Category for per-category scores: MMLU stem/humanities/social_sciences/other, C-Eval
// STEM/Social Science/Humanities/Other; CMMLU has none in lm-eval ("" then).
std::string SubjectCategory(McTask task, const std::string& subject);

std::string McDescription(McTask task, const std::string& subject);
// doc_to_text: question (stripped), the four options, then "Answer:" or "答案：".
std::string McQueryText(McTask task, const McItem& item);
// description + k examples from `dev` (first k; fewer when dev is shorter) + query.
std::string McPrompt(McTask task, const std::string& subject, const std::vector<McItem>& dev,
                     int num_fewshot, const McItem& item);

// gsm8k_cot: "Q: {question}\nA:" after the first `num_fewshot` (<= 8) Wei et al. exemplars.
inline constexpr int kGsmMaxFewshot = 8;
std::string GsmPrompt(const std::string& question, int num_fewshot);
// The generation stop sequences of gsm8k_cot.
const std::vector<std::string>& GsmStopSequences();
// The reference: the text after the last '####', stripped.
std::string GsmTarget(const std::string& answer);

// Filters: strict-match `The answer is (\-?[0-9\.\,]+).` (first match), flexible-extract
// `(-?[$0-9.,]{2,})|(-?[0-9]+)` (last match); "[invalid]" when nothing matches.
std::string GsmStrictExtract(const std::string& response);
std::string GsmFlexibleExtract(const std::string& response);
// exact_match with ignore_case and regexes_to_ignore [",", "\$", "(?s).*#### ", "\.$"].
std::string GsmNormalize(const std::string& text);
bool GsmExactMatch(const std::string& prediction, const std::string& reference);

}  // namespace dh::tools
