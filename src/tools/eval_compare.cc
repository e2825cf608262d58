// Paired comparison of two eval reports (eval_compare.h).
#include "tools/eval_compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace dh::tools {
namespace {

using Json = nlohmann::json;

// The metrics of a record: name -> correct.
std::vector<std::pair<std::string, bool>> Outcomes(const Json& r) {
  if (r.value("task", "") == "gsm8k")
    return {{"exact_match,strict-match", r.value("strict_correct", false)},
            {"exact_match,flexible-extract", r.value("flexible_correct", false)}};
  return {{"acc", r.value("correct", false)}};
}

}  // namespace

double McNemarExactP(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n == 0) return 1.0;
  const int64_t k = std::min(b, c);
  // P(X <= k) for X ~ Binomial(n, 1/2), summed in log space (n can be thousands).
  double cdf = 0;
  for (int64_t i = 0; i <= k; ++i)
    cdf += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) -
                    n * std::log(2.0));
  return std::min(1.0, 2 * cdf);
}

std::vector<CompareRow> CompareReports(const Json& a, const Json& b) {
  std::map<std::string, const Json*> by_key;
  for (const Json& r : b["items"]) by_key[r.value("key", "")] = &r;
  std::map<std::pair<std::string, std::string>, CompareRow> rows;
  std::map<std::string, int64_t> matched_b;
  for (const Json& ra : a["items"]) {
    const std::string task = ra.value("task", "");
    auto it = by_key.find(ra.value("key", ""));
    const auto oa = Outcomes(ra);
    if (it == by_key.end()) {
      for (const auto& [metric, ok] : oa) {
        CompareRow& row = rows[{task, metric}];
        row.task = task;
        row.metric = metric;
        row.unmatched++;
      }
      continue;
    }
    matched_b[task]++;
    const auto ob = Outcomes(*it->second);
    for (size_t m = 0; m < oa.size() && m < ob.size(); ++m) {
      CompareRow& row = rows[{task, oa[m].first}];
      row.task = task;
      row.metric = oa[m].first;
      row.n++;
      row.acc_a += oa[m].second;
      row.acc_b += ob[m].second;
      row.only_a += oa[m].second && !ob[m].second;
      row.only_b += !oa[m].second && ob[m].second;
    }
  }
  std::map<std::string, int64_t> total_b;
  for (const Json& r : b["items"]) total_b[r.value("task", "")]++;
  std::vector<CompareRow> out;
  for (auto& [key, row] : rows) {
    if (row.n > 0) {
      row.acc_a /= row.n;
      row.acc_b /= row.n;
    }
    row.unmatched += total_b[row.task] - matched_b[row.task];
    row.p_value = McNemarExactP(row.only_a, row.only_b);
    out.push_back(row);
  }
  return out;
}

std::string FormatCompare(const std::vector<CompareRow>& rows, const std::string& name_a,
                          const std::string& name_b) {
  std::string out = fmt::format("A = {}\nB = {}\n", name_a, name_b);
  out += fmt::format("{:<7} {:<29} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9}\n", "task", "metric",
                     "n", "A", "B", "B-A", "A only", "B only", "p (McN.)");
  for (const CompareRow& r : rows) {
    out += fmt::format("{:<7} {:<29} {:>6} {:>8.4f} {:>8.4f} {:>+8.4f} {:>6} {:>6} {:>9.4g}\n",
                       r.task, r.metric, r.n, r.acc_a, r.acc_b, r.acc_b - r.acc_a, r.only_a,
                       r.only_b, r.p_value);
    if (r.unmatched > 0)
      out += fmt::format("        ({} items appear in only one report and are left out)\n",
                         r.unmatched);
  }
  return out;
}

Json CompareJson(const std::vector<CompareRow>& rows) {
  Json out = Json::array();
  for (const CompareRow& r : rows)
    out.push_back({{"task", r.task},
                   {"metric", r.metric},
                   {"n", r.n},
                   {"acc_a", r.acc_a},
                   {"acc_b", r.acc_b},
                   {"diff", r.acc_b - r.acc_a},
                   {"only_a", r.only_a},
                   {"only_b", r.only_b},
                   {"p_value", r.p_value},
                   {"unmatched", r.unmatched},
                   {"test", "exact McNemar (two-sided binomial on discordant pairs)"}});
  return out;
}

}  // namespace dh::tools
