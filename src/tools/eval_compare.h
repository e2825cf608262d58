// `deepharness eval --compare A.json B.json`: per task and metric, the two accuracies on the items
// both reports scored, and an exact McNemar test on the paired outcomes (two-sided binomial test
// of the discordant pairs), so "B is within noise of A" comes with a p-value.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dh::tools {

// Two-sided exact McNemar p-value: b = pairs only A got right, c = pairs only B got right.
double McNemarExactP(int64_t b, int64_t c);

struct CompareRow {
  std::string task, metric;
  int64_t n = 0;  // items in both reports
  double acc_a = 0, acc_b = 0;
  int64_t only_a = 0, only_b = 0;  // discordant pairs
  double p_value = 1;
  int64_t unmatched = 0;  // items in only one report
};

std::vector<CompareRow> CompareReports(const nlohmann::json& a, const nlohmann::json& b);
std::string FormatCompare(const std::vector<CompareRow>& rows, const std::string& name_a,
                          const std::string& name_b);
nlohmann::json CompareJson(const std::vector<CompareRow>& rows);

}  // namespace dh::tools
