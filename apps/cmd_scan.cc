// `deepharness scan PATH...`: reports CUDA lock-in in a source tree (Python, C/C++/CUDA, CMake,
// requirements, Dockerfiles, shell and YAML deploy files) with the category of each finding on the
// chosen target, its replacement and an effort estimate (docs/migration.md).
// Exit codes: 0 nothing at or above --fail-on, 1 findings at or above it, 2 bad input.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "apps/command.h"
#include "apps/model_options.h"
#include "scan/report.h"
#include "scan/scanner.h"

namespace dh::app {
namespace {

std::function<int()> SetupScan(CLI::App* sub) {
  struct Args {
    std::vector<std::string> paths;
    std::string target = "ascend", format = "text", output, baseline, write_baseline;
    std::string fail_on = "none";
    std::vector<std::string> exclude, disable;
    int jobs = 0;
    bool list_rules = false;
  };
  auto a = std::make_shared<Args>();
  sub->add_option("paths", a->paths, "Files or directories to scan");
  sub->add_option("--target", a->target, "Target backend: ascend, rocm or cpu")->capture_default_str();
  sub->add_option("--format", a->format, "text, json, csv, sarif or markdown")->capture_default_str();
  sub->add_option("--output,-o", a->output, "Write the report to FILE instead of stdout");
  sub->add_option("--baseline", a->baseline,
                  "Known findings to leave out (a file written by --write-baseline)");
  sub->add_option("--write-baseline", a->write_baseline,
                  "Write the current findings as a baseline file");
  sub->add_option("--fail-on", a->fail_on,
                  "Exit 1 when a finding reaches: none, any, partial, costly or error")
      ->capture_default_str();
  sub->add_option("--exclude", a->exclude, "Skip paths matching GLOB ('*' wildcard); repeatable");
  sub->add_option("--disable", a->disable, "Skip rules matching GLOB, e.g. CC0*; repeatable");
  sub->add_option("--jobs", a->jobs, "Threads (0: all CPUs)")->capture_default_str();
  sub->add_flag("--list-rules", a->list_rules, "Print the rule catalogue and exit");
  return [a]() -> int {
    scan::ScanOptions opt;
    if (!scan::ParseTarget(a->target, &opt.target)) {
      return ReportError(InvalidArgument("--target: {}: expected ascend, rocm or cpu", a->target));
    }
    scan::Format format;
    if (!scan::ParseFormat(a->format, &format)) {
      return ReportError(
          InvalidArgument("--format: {}: expected text, json, csv, sarif or markdown", a->format));
    }
    if (!scan::ParseFailOn(a->fail_on)) {
      return ReportError(
          InvalidArgument("--fail-on: {}: expected none, any, partial, costly or error", a->fail_on));
    }
    if (a->jobs < 0) return ReportError(InvalidArgument("--jobs: expected >= 0"));
    if (a->list_rules) {
      const int t = static_cast<int>(opt.target);
      for (const scan::Rule& r : scan::Rules()) {
        std::printf("%-6s %-8s w=%-2d %-10s %s\n       -> %s\n", r.id.c_str(),
                    scan::CategoryName(r.category[t]), r.weight, scan::CountModeName(r.count_mode),
                    r.title.c_str(), r.replacement[t].c_str());
      }
      return kExitOk;
    }
    if (a->paths.empty()) return ReportError(InvalidArgument("scan: give at least one PATH"));
    opt.jobs = a->jobs;
    opt.excludes = a->exclude;
    opt.disabled = a->disable;
    auto report = scan::ScanPaths(a->paths, opt);
    if (!report.ok()) return ReportError(report.status());
    if (!a->baseline.empty()) {
      Status st = scan::ApplyBaseline(a->baseline, &*report);
      if (!st.ok()) return ReportError(st);
    }
    if (!a->write_baseline.empty()) {
      std::ofstream out(a->write_baseline, std::ios::binary);
      out << scan::FormatBaseline(report->findings);
      if (!out) return ReportError(IoError("{}: cannot write the baseline", a->write_baseline));
    }
    const std::string text = scan::FormatReport(*report, format);
    if (a->output.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      std::ofstream out(a->output, std::ios::binary);
      out << text;
      if (!out) return ReportError(IoError("{}: cannot write the report", a->output));
    }
    return scan::FailsOn(*report, a->fail_on) ? kExitFailure : kExitOk;
  };
}

DH_REGISTER_COMMAND(scan_cmd, "scan", "Find CUDA lock-in in a source tree (migration report)",
                    SetupScan);

}  // namespace
}  // namespace dh::app
