#include "scan/report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

namespace dh::scan {
namespace {

using nlohmann::json;

const char* kVersion = "1.0";
const char* kInfoUri = "https://github.com/deepharness/deepharness/blob/main/docs/migration.md";

std::string Hours(double h) {
  if (h < 1) return fmt::format("{:.0f} min", h * 60);
  if (h < 16) return fmt::format("{:.1f} h", h);
  return fmt::format("{:.1f} days", h / 8);
}

int T(const ScanReport& r) { return static_cast<int>(r.target); }

std::string CsvField(std::string_view s) {
  bool quote = s.find_first_of(",\"\n\r") != std::string_view::npos;
  // Cells that a spreadsheet would run as a formula get a leading apostrophe.
  std::string v(s);
  if (!v.empty() && (v[0] == '=' || v[0] == '+' || v[0] == '-' || v[0] == '@')) {
    v = "'" + v;
    quote = true;
  }
  if (!quote) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string UriEncode(std::string_view path) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string MdCell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '`') {
      out += '\'';
    } else {
      out += c;
    }
  }
  return out;
}

json FindingJson(const Finding& f, int t) {
  return {{"path", f.path},
          {"line", f.line},
          {"column", f.col},
          {"rule", f.rule->id},
          {"title", f.rule->title},
          {"category", CategoryName(f.rule->category[t])},
          {"severity", SeverityName(f.rule->severity)},
          {"symbol", f.symbol},
          {"code", f.code},
          {"replacement", f.rule->replacement[t]},
          {"weight", f.rule->weight},
          {"count_mode", CountModeName(f.rule->count_mode)}};
}

json SummaryJson(const ScanReport& r) {
  json by_rule = json::object();
  for (const auto& [id, rt] : r.by_rule) {
    by_rule[id] = {{"hits", rt.hits},   {"files", rt.files}, {"symbols", rt.symbols},
                   {"units", rt.units}, {"hours", rt.hours}, {"points", rt.points}};
  }
  return {{"files_scanned", r.files_scanned},
          {"files_skipped", r.files_skipped},
          {"bytes_scanned", r.bytes_scanned},
          {"lines_scanned", r.lines_scanned},
          {"files_by_class", r.files_by_class},
          {"findings", r.findings.size()},
          {"suppressed", r.suppressed},
          {"baselined", r.baselined},
          {"by_category",
           {{"direct", r.by_category[0]}, {"partial", r.by_category[1]}, {"costly", r.by_category[2]}}},
          {"by_rule", by_rule},
          {"effort_hours", {{"low", r.hours_low}, {"estimate", r.hours}, {"high", r.hours_high}}},
          {"costly_share", r.costly_share},
          {"bucket", r.bucket}};
}

std::string Text(const ScanReport& r) {
  const int t = T(r);
  std::string out;
  for (const Finding& f : r.findings) {
    out += fmt::format("{}:{}:{}: {} [{}, {}] {}\n    {}\n    -> {}\n", f.path, f.line, f.col,
                       f.rule->id, CategoryName(f.rule->category[t]), SeverityName(f.rule->severity),
                       f.rule->title, f.code, f.rule->replacement[t]);
  }
  if (!r.findings.empty()) out += "\n";
  out += fmt::format("Target: {}. Scanned {} files ({} lines, {:.1f} MB)", TargetName(r.target),
                     r.files_scanned, r.lines_scanned, r.bytes_scanned / 1e6);
  if (r.files_skipped > 0) out += fmt::format(", skipped {}", r.files_skipped);
  out += ".\n";
  std::string classes;
  for (const auto& [k, v] : r.files_by_class) {
    classes += fmt::format("{}{} {}", classes.empty() ? "" : ", ", k, v);
  }
  if (!classes.empty()) out += "Files: " + classes + ".\n";
  out += fmt::format("Findings: {} (direct {}, partial {}, costly {}); suppressed {}, baselined {}.\n",
                     r.findings.size(), r.by_category[0], r.by_category[1], r.by_category[2],
                     r.suppressed, r.baselined);
  if (!r.by_rule.empty()) {
    out += fmt::format("\n{:<6} {:<8} {:>5} {:>5} {:>7} {:>6} {:>10}  {}\n", "rule", "category",
                       "hits", "files", "symbols", "points", "effort", "title");
    std::vector<std::pair<std::string, RuleTotals>> rows(r.by_rule.begin(), r.by_rule.end());
    std::stable_sort(rows.begin(), rows.end(),
                     [](const auto& a, const auto& b) { return a.second.hours > b.second.hours; });
    for (const auto& [id, rt] : rows) {
      const Rule* rule = FindRule(id);
      out += fmt::format("{:<6} {:<8} {:>5} {:>5} {:>7} {:>6} {:>10}  {}\n", id,
                         CategoryName(rule->category[t]), rt.hits, rt.files, rt.symbols, rt.points,
                         Hours(rt.hours), rule->title);
    }
  }
  out += fmt::format("\nEffort: {} to {} (estimate {}); {:.0f}% from costly rules: {}.\n",
                     Hours(r.hours_low), Hours(r.hours_high), Hours(r.hours), r.costly_share * 100,
                     r.bucket);
  out += "The scan is lexical (comments and strings are told apart from code, imports are "
         "resolved per file); data flow is not followed.\n";
  for (const std::string& w : r.warnings) out += "warning: " + w + "\n";
  return out;
}

std::string Csv(const ScanReport& r) {
  const int t = T(r);
  std::string out =
      "file,start_line,end_line,column,rule_id,category,severity,symbol,snippet,replacement,weight,"
      "count_mode\n";
  for (const Finding& f : r.findings) {
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", CsvField(f.path), f.line, f.line,
                       f.col, f.rule->id, CategoryName(f.rule->category[t]),
                       SeverityName(f.rule->severity), CsvField(f.symbol), CsvField(f.code),
                       CsvField(f.rule->replacement[t]), f.rule->weight,
                       CountModeName(f.rule->count_mode));
  }
  return out;
}

std::string Sarif(const ScanReport& r) {
  const int t = T(r);
  json rules = json::array();
  std::map<std::string, int> rule_index;
  for (const Rule& rule : Rules()) {
    rule_index[rule.id] = static_cast<int>(rules.size());
    rules.push_back(
        {{"id", rule.id},
         {"name", rule.id},
         {"shortDescription", {{"text", rule.title}}},
         {"fullDescription",
          {{"text", fmt::format("{} ({} on {}).", rule.title, CategoryName(rule.category[t]),
                                TargetName(r.target))}}},
         {"help",
          {{"text", fmt::format("On {}: {}. ascend: {}; rocm: {}; cpu: {}.", TargetName(r.target),
                                rule.replacement[t], rule.replacement[0], rule.replacement[1],
                                rule.replacement[2])}}},
         {"helpUri", kInfoUri},
         {"defaultConfiguration",
          {{"level", rule.severity == Severity::kError ? "error" : "warning"}}},
         {"properties",
          {{"category", CategoryName(rule.category[t])},
           {"weight", rule.weight},
           {"countMode", CountModeName(rule.count_mode)},
           {"tags", json::array({"cuda-migration", rule.family})}}}});
  }
  json results = json::array();
  for (const Finding& f : r.findings) {
    json region = {{"startLine", f.line}, {"startColumn", f.char_col}};
    if (!f.code.empty()) region["snippet"] = {{"text", f.code}};
    results.push_back(
        {{"ruleId", f.rule->id},
         {"ruleIndex", rule_index[f.rule->id]},
         {"level", f.rule->severity == Severity::kError ? "error" : "warning"},
         {"message",
          {{"text", fmt::format("{} ({}): {} -> {}", f.rule->title, CategoryName(f.rule->category[t]),
                                f.symbol, f.rule->replacement[t])}}},
         {"locations",
          json::array({{{"physicalLocation",
                         {{"artifactLocation", {{"uri", UriEncode(f.path)}, {"uriBaseId", "SRCROOT"}}},
                          {"region", region}}}}})},
         {"properties", {{"category", CategoryName(f.rule->category[t])}, {"symbol", f.symbol}}}});
  }
  json run = {{"tool",
               {{"driver",
                 {{"name", "deepharness-scan"},
                  {"version", kVersion},
                  {"informationUri", kInfoUri},
                  {"rules", rules}}}}},
              {"columnKind", "unicodeCodePoints"},
              {"results", results},
              {"properties",
               {{"target", TargetName(r.target)}, {"summary", SummaryJson(r)}}}};
  json doc = {{"$schema", "https://json.schemastore.org/sarif-2.1.0.json"},
              {"version", "2.1.0"},
              {"runs", json::array({run})}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string Json(const ScanReport& r) {
  json findings = json::array();
  for (const Finding& f : r.findings) findings.push_back(FindingJson(f, T(r)));
  json doc = {{"tool", "deepharness scan"},
              {"version", kVersion},
              {"target", TargetName(r.target)},
              {"summary", SummaryJson(r)},
              {"findings", findings},
              {"warnings", r.warnings}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string Markdown(const ScanReport& r) {
  const int t = T(r);
  std::string out = fmt::format("# CUDA dependency scan (target: {})\n\n", TargetName(r.target));
  out += fmt::format(
      "- Files scanned: {} ({} lines)\n- Findings: {} (direct {}, partial {}, costly {}); "
      "suppressed {}, baselined {}\n- Effort: **{} to {}** (estimate {}), {:.0f}% from costly "
      "rules: **{}**\n\n",
      r.files_scanned, r.lines_scanned, r.findings.size(), r.by_category[0], r.by_category[1],
      r.by_category[2], r.suppressed, r.baselined, Hours(r.hours_low), Hours(r.hours_high),
      Hours(r.hours), r.costly_share * 100, r.bucket);
  if (!r.by_rule.empty()) {
    out += "## By rule\n\n| Rule | Category | Hits | Files | Effort | What |\n|---|---|---:|---:|---:|---|\n";
    for (const auto& [id, rt] : r.by_rule) {
      const Rule* rule = FindRule(id);
      out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", id, CategoryName(rule->category[t]),
                         rt.hits, rt.files, Hours(rt.hours), MdCell(rule->title));
    }
    out += "\n## Findings\n\n| Location | Rule | Category | Code | Replacement |\n|---|---|---|---|---|\n";
    for (const Finding& f : r.findings) {
      out += fmt::format("| {}:{}:{} | {} | {} | `{}` | {} |\n", MdCell(f.path), f.line, f.col,
                         f.rule->id, CategoryName(f.rule->category[t]), MdCell(f.code),
                         MdCell(f.rule->replacement[t]));
    }
  }
  return out;
}

}  // namespace

bool ParseFormat(std::string_view s, Format* f) {
  if (s == "text") *f = Format::kText;
  else if (s == "json") *f = Format::kJson;
  else if (s == "csv") *f = Format::kCsv;
  else if (s == "sarif") *f = Format::kSarif;
  else if (s == "markdown" || s == "md") *f = Format::kMarkdown;
  else return false;
  return true;
}

std::string FormatReport(const ScanReport& report, Format format) {
  switch (format) {
    case Format::kText: return Text(report);
    case Format::kJson: return Json(report);
    case Format::kCsv: return Csv(report);
    case Format::kSarif: return Sarif(report);
    case Format::kMarkdown: return Markdown(report);
  }
  return "";
}

bool ParseFailOn(std::string_view s) {
  return s == "none" || s == "any" || s == "partial" || s == "costly" || s == "error";
}

bool FailsOn(const ScanReport& report, std::string_view level) {
  const int t = T(report);
  for (const Finding& f : report.findings) {
    const Category c = f.rule->category[t];
    if (level == "any") return true;
    if (level == "partial" && c != Category::kDirect) return true;
    if (level == "costly" && c == Category::kCostly) return true;
    if (level == "error" && f.rule->severity == Severity::kError) return true;
  }
  return false;
}

}  // namespace dh::scan
