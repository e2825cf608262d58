// Benchmark results as one self-contained HTML page with inline SVG charts (no scripts, no
// external resources): `deepharness bench --report FILE.html`, `bench serve --report FILE.html`
// and `--compare a.json b.json` (side by side from saved JSON results).
//
// Input is the JSON the benchmarks write: `bench --json` (key "results": pp/tg rows) or `bench
// serve --json` / --result-file (vllm bench serve keys; "ttfts"/"e2els" in seconds give the
// CDFs, "itls" the pooled ITL CDF). A file may also hold an array of such objects (several
// concurrency levels of one `bench serve --concurrency 1,4,16` run). Every text that comes from
// the input is escaped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh::tools {

struct ReportRun {
  std::string label;       // series name (a file's stem, or the model)
  nlohmann::json result;   // one benchmark result object
};

// & < > " ' -> entities.
std::string HtmlEscape(const std::string& text);

// The page. Runs of both kinds may be mixed; each kind gets its section.
std::string BenchReportHtml(const std::vector<ReportRun>& runs, const std::string& title);

// Reads JSON result files (an object or an array of objects each); the label is the file stem.
// Errors name the file.
Result<std::vector<ReportRun>> LoadReportRuns(const std::vector<std::string>& paths);

// Checks, before a long benchmark, that `path` can be written (its folder exists and is
// writable); error names the path.
Status CheckReportPath(const std::string& path);

// Writes `text` to `path` (error names the path).
Status WriteReportFile(const std::string& path, const std::string& text);

}  // namespace dh::tools
