// Reports of `deepharness compare`: one JSON document (configuration, checks, overall figures,
// every run with both texts and metrics), a Markdown page (checks, overall table, per-prompt
// table, and for each diverging greedy prompt where it diverged) and the terminal summary.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tools/compare.h"
#include "tools/compare_metrics.h"

namespace dh::tools {

struct CompareReportInput {
  const CompareResult* result = nullptr;
  const CompareOptions* options = nullptr;
  const CompareTargetSpec* a = nullptr;
  const CompareTargetSpec* b = nullptr;
  std::string prompts_file;
  std::vector<CompareCheck> checks;
  bool pass = false;
};

nlohmann::json CompareReportJson(const CompareReportInput& in);
std::string CompareReportMarkdown(const CompareReportInput& in);
std::string CompareReportText(const CompareReportInput& in);

}  // namespace dh::tools
