// `deepharness scan`: walks paths, lexes each file by its class, matches the rule catalogue,
// applies inline suppressions and a baseline, and sums the effort model (docs/migration.md).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "scan/lexers.h"
#include "scan/rules.h"

namespace dh::scan {

struct Finding {
  const Rule* rule = nullptr;
  std::string path;  // as given on the command line, joined with the relative file path
  int line = 0, col = 0;  // 1-based; col counts bytes
  int char_col = 0;       // 1-based, counting Unicode code points (SARIF)
  std::string symbol;     // what matched (resolved name, header, word)
  std::string unit;       // what a per-symbol rule counts once: the module for Python names and
                          // requirements, the kernel for CC06, else the symbol ("" = not a unit)
  std::string code;       // the source line, trimmed (at most 200 bytes)
};

struct ScanOptions {
  Target target = Target::kAscend;
  int jobs = 0;                       // 0: all available CPUs
  std::vector<std::string> excludes;  // globs on the relative path or a path component
  std::vector<std::string> disabled;  // rule-id globs, e.g. "CC0*"
  uint64_t max_file_bytes = 8u << 20;  // larger files are skipped (and counted)
};

struct RuleTotals {
  int hits = 0;
  int files = 0;
  int symbols = 0;
  double units = 0;   // priced units after the count mode and the per-file cap
  double hours = 0;   // units x HoursForWeight(weight)
  int points = 0;     // units x weight (rounded)
};

struct ScanReport {
  Target target = Target::kAscend;
  std::vector<Finding> findings;  // after suppressions and the baseline, sorted by path/line/col
  int files_scanned = 0;
  int files_skipped = 0;        // too large, binary or unreadable
  uint64_t bytes_scanned = 0;
  uint64_t lines_scanned = 0;
  int suppressed = 0;           // by inline comments
  int baselined = 0;            // by the baseline file
  std::map<std::string, int> files_by_class;
  std::map<std::string, RuleTotals> by_rule;  // rule id -> totals (rules with findings only)
  int by_category[3] = {0, 0, 0};             // findings per category on the target
  double hours = 0;             // effort estimate (central)
  double hours_low = 0, hours_high = 0;  // 0.7x and 1.5x
  double costly_share = 0;      // share of hours from costly rules
  std::string bucket;           // "mostly mechanical", "moderate", "kernel rewrite project"
  std::vector<std::string> warnings;  // e.g. unreadable files
};

// Scans one in-memory file (used by the tree scan and by tests).
std::vector<Finding> ScanText(const std::string& display_path, FileClass cls,
                              const std::string& text, int* suppressed, int* lines = nullptr);

// Scans files and directories. A missing path is an error; unreadable files inside a tree are
// warnings.
Result<ScanReport> ScanPaths(const std::vector<std::string>& paths, const ScanOptions& options);

// Baseline: one line per finding, "RULE<TAB>path<TAB>code" (line numbers are left out so that
// edits elsewhere in a file do not invalidate it). Each baseline line absorbs one finding.
std::string FormatBaseline(const std::vector<Finding>& findings);
Status ApplyBaseline(const std::string& baseline_path, ScanReport* report);

// Recomputes the per-rule totals, categories and effort from report->findings.
void Summarize(ScanReport* report);

}  // namespace dh::scan
