// HTML + inline SVG benchmark reports (see report_html.h). Charts are drawn here as SVG
// elements: grouped bars (with error or p99 whiskers), horizontal fraction bars and CDF steps.
#include "tools/report_html.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace dh::tools {
namespace {

using Json = nlohmann::json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const char* const kColors[] = {"#2f6fdf", "#e0582b", "#2a9d57", "#9b51e0", "#c8a000", "#0f9fb5",
                               "#d6336c", "#6b7280"};

const char* Color(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

double Num(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return kNaN;
  const Json& v = j[key];
  return v.is_number() ? v.get<double>() : kNaN;
}

std::string Str(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const Json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number()) return v.dump();
  return "";
}

std::string Fmt(double v) {
  if (!std::isfinite(v)) return "–";
  const double a = std::fabs(v);
  if (a >= 1000) return fmt::format("{:.0f}", v);
  if (a >= 10) return fmt::format("{:.1f}", v);
  if (a >= 0.1 || a == 0) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3g}", v);
}

// Smallest of 1, 2, 2.5, 5 x 10^k at or above v.
double NiceCeil(double v) {
  if (!(v > 0) || !std::isfinite(v)) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * p >= v * (1 - 1e-12)) return m * p;
  return 10 * p;
}

bool IsServe(const Json& j) { return j.is_object() && j.contains("request_throughput"); }
bool IsModel(const Json& j) { return j.is_object() && j.contains("results") && j["results"].is_array(); }

std::vector<double> Samples(const Json& j, const char* key, double scale) {
  std::vector<double> out;
  if (!j.is_object() || !j.contains(key) || !j[key].is_array()) return out;
  for (const Json& v : j[key]) {
    if (v.is_number()) out.push_back(v.get<double>() * scale);
    if (v.is_array()) {  // itls: one list per request, pooled
      for (const Json& w : v)
        if (w.is_number()) out.push_back(w.get<double>() * scale);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// ---- SVG pieces ----------------------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<double> values;    // one per category (NaN: none)
  std::vector<double> whiskers;  // optional upper end per category (stddev top or p99)
};

// Grouped vertical bars: one group per category, one bar per series.
std::string BarChart(const std::string& title, const std::string& unit,
                     const std::vector<std::string>& categories, const std::vector<Series>& series,
                     const std::string& whisker_note = "") {
  const double W = 640, H = 260, L = 56, R = 12, T = 12, B = 44;
  double ymax = 0;
  for (const Series& s : series) {
    for (double v : s.values)
      if (std::isfinite(v)) ymax = std::max(ymax, v);
    for (double v : s.whiskers)
      if (std::isfinite(v)) ymax = std::max(ymax, v);
  }
  ymax = NiceCeil(ymax);
  auto y = [&](double v) { return T + (H - T - B) * (1 - v / ymax); };
  std::string svg = fmt::format(
      "<figure class=\"chart\"><figcaption>{}{}</figcaption><svg viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\">",
      HtmlEscape(title), unit.empty() ? "" : " (" + HtmlEscape(unit) + ")", W, H, HtmlEscape(title));
  for (int i = 0; i <= 4; ++i) {
    const double v = ymax * i / 4;
    svg += fmt::format("<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", L,
                       W - R, y(v), y(v));
    svg += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>",
                       L - 6, y(v) + 4, Fmt(v));
  }
  const size_t nc = std::max<size_t>(1, categories.size());
  const size_t ns = std::max<size_t>(1, series.size());
  const double group = (W - L - R) / nc;
  const double bar = std::min(48.0, group * 0.8 / ns);
  for (size_t c = 0; c < categories.size(); ++c) {
    const double gx = L + group * c + (group - bar * ns) / 2;
    for (size_t s = 0; s < series.size(); ++s) {
      const double v = c < series[s].values.size() ? series[s].values[c] : kNaN;
      if (!std::isfinite(v)) continue;
      const double x = gx + bar * s;
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
          "<title>{}: {}</title></rect>",
          x + 1, y(v), bar - 2, std::max(0.0, y(0) - y(v)), Color(s),
          HtmlEscape(series[s].name + " · " + categories[c]), Fmt(v));
      const double w = c < series[s].whiskers.size() ? series[s].whiskers[c] : kNaN;
      if (std::isfinite(w)) {
        const double cx = x + bar / 2;
        svg += fmt::format(
            "<line class=\"whisker\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1:.1f}\" y2=\"{2:.1f}\"/>"
            "<line class=\"whisker\" x1=\"{3:.1f}\" x2=\"{4:.1f}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\"/>",
            cx, y(v), y(w), cx - bar / 4, cx + bar / 4);
      }
      if (bar >= 26)
        svg += fmt::format("<text class=\"val\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>",
                           x + bar / 2, y(v) - 3, Fmt(v));
    }
    svg += fmt::format("<text class=\"cat\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                       L + group * (c + 0.5), H - B + 16, HtmlEscape(categories[c]));
  }
  svg += "</svg><div class=\"legend\">";
  for (size_t s = 0; s < series.size(); ++s)
    svg += fmt::format("<span><i style=\"background:{}\"></i>{}</span>", Color(s), HtmlEscape(series[s].name));
  if (!whisker_note.empty()) svg += "<span class=\"note\">" + HtmlEscape(whisker_note) + "</span>";
  svg += "</div></figure>\n";
  return svg;
}

// Horizontal bars of fractions in [0, 1] (shown as %).
std::string FractionBars(const std::string& title, const std::vector<std::pair<std::string, double>>& rows) {
  const double W = 640, L = 220, R = 60, row = 26, T = 8;
  const double H = T * 2 + row * rows.size() + 18;
  std::string svg = fmt::format(
      "<figure class=\"chart\"><figcaption>{}</figcaption><svg viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"{}\">",
      HtmlEscape(title), W, H, HtmlEscape(title));
  const double span = W - L - R;
  for (int i = 0; i <= 4; ++i) {
    const double x = L + span * i / 4;
    svg += fmt::format("<line class=\"grid\" x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\"/>"
                       "<text class=\"tick\" x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}%</text>",
                       x, T, H - 18, H - 4, 25 * i);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const double v = std::clamp(rows[i].second, 0.0, 1.0);
    const double yy = T + row * i;
    svg += fmt::format(
        "<text class=\"cat\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>"
        "<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>"
        "<text class=\"val\" x=\"{:.1f}\" y=\"{:.1f}\">{:.1f}%</text>",
        L - 8, yy + 17, HtmlEscape(rows[i].first), L, yy + 4, span * v, row - 8, Color(i), L + span * v + 4,
        yy + 17, 100 * rows[i].second);
  }
  svg += "</svg></figure>\n";
  return svg;
}

// Empirical CDFs (sorted samples, ms) as step lines.
std::string CdfChart(const std::string& title, const std::vector<std::pair<std::string, std::vector<double>>>& curves) {
  const double W = 640, H = 260, L = 56, R = 12, T = 12, B = 34;
  double xmax = 0;
  for (const auto& [name, v] : curves)
    if (!v.empty()) xmax = std::max(xmax, v.back());
  xmax = NiceCeil(xmax);
  auto x = [&](double v) { return L + (W - L - R) * v / xmax; };
  auto y = [&](double f) { return T + (H - T - B) * (1 - f); };
  std::string svg = fmt::format(
      "<figure class=\"chart\"><figcaption>{} (ms)</figcaption><svg viewBox=\"0 0 {} {}\" "
      "role=\"img\" aria-label=\"{}\">",
      HtmlEscape(title), W, H, HtmlEscape(title));
  for (int i = 0; i <= 4; ++i) {
    svg += fmt::format("<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\"/>", L, W - R,
                       y(i / 4.0), y(i / 4.0));
    svg += fmt::format("<text class=\"tick\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.2f}</text>", L - 6,
                       y(i / 4.0) + 4, i / 4.0);
    svg += fmt::format("<text class=\"tick\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                       x(xmax * i / 4), H - B + 16, Fmt(xmax * i / 4));
  }
  for (size_t c = 0; c < curves.size(); ++c) {
    const std::vector<double>& v = curves[c].second;
    if (v.empty()) continue;
    // At most ~400 steps: thin long sample lists evenly (the curve's shape is kept).
    const size_t step = std::max<size_t>(1, v.size() / 400);
    std::string pts = fmt::format("{:.1f},{:.1f}", x(v[0]), y(0));
    for (size_t i = 0; i < v.size(); i += step) {
      const size_t last = std::min(v.size() - 1, i + step - 1);
      pts += fmt::format(" {:.1f},{:.1f} {:.1f},{:.1f}", x(v[i]), y(static_cast<double>(i) / v.size()),
                         x(v[last]), y(static_cast<double>(last + 1) / v.size()));
    }
    svg += fmt::format("<polyline class=\"cdf\" points=\"{}\" stroke=\"{}\"/>", pts, Color(c));
  }
  svg += "</svg><div class=\"legend\">";
  for (size_t c = 0; c < curves.size(); ++c)
    svg += fmt::format("<span><i style=\"background:{}\"></i>{} ({} samples)</span>", Color(c),
                       HtmlEscape(curves[c].first), curves[c].second.size());
  svg += "</div></figure>\n";
  return svg;
}

std::string Table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows) {
  std::string t = "<table><thead><tr>";
  for (const std::string& h : head) t += "<th>" + HtmlEscape(h) + "</th>";
  t += "</tr></thead><tbody>";
  for (const auto& r : rows) {
    t += "<tr>";
    for (const std::string& c : r) t += "<td>" + HtmlEscape(c) + "</td>";
    t += "</tr>";
  }
  return t + "</tbody></table>\n";
}

// ---- sections ------------------------------------------------------------------------------

std::string ServeSection(const std::vector<const ReportRun*>& runs) {
  std::string out = "<section><h2>Serving benchmark (bench serve)</h2>\n";
  // Series = labels in first-seen order; categories = concurrency levels.
  std::vector<std::string> labels;
  std::set<double> levels;
  for (const ReportRun* r : runs) {
    if (std::find(labels.begin(), labels.end(), r->label) == labels.end()) labels.push_back(r->label);
    levels.insert(Num(r->result, "max_concurrency"));
  }
  std::vector<double> level_list(levels.begin(), levels.end());
  std::vector<std::string> cats;
  for (double c : level_list)
    cats.push_back(std::isfinite(c) ? fmt::format("concurrency {:.0f}", c) : "concurrency ?");
  auto find = [&](const std::string& label, double level) -> const Json* {
    for (const ReportRun* r : runs) {
      const double c = Num(r->result, "max_concurrency");
      if (r->label == label && (c == level || (std::isnan(c) && std::isnan(level)))) return &r->result;
    }
    return nullptr;
  };
  auto series = [&](const char* key, const char* whisker, const std::string& suffix) {
    std::vector<Series> s;
    for (const std::string& label : labels) {
      Series one{label + suffix, {}, {}};
      for (double level : level_list) {
        const Json* j = find(label, level);
        one.values.push_back(j ? Num(*j, key) : kNaN);
        one.whiskers.push_back(j && whisker ? Num(*j, whisker) : kNaN);
      }
      s.push_back(std::move(one));
    }
    return s;
  };

  std::vector<std::vector<std::string>> rows;
  for (const ReportRun* r : runs) {
    const Json& j = r->result;
    rows.push_back({r->label, Str(j, "model_id"), Str(j, "max_concurrency"), Str(j, "request_rate"),
                    Fmt(Num(j, "completed")) + " / " + Fmt(Num(j, "failed")), Fmt(Num(j, "duration")),
                    Fmt(Num(j, "request_throughput")), Fmt(Num(j, "output_throughput")),
                    Fmt(Num(j, "median_ttft_ms")) + " / " + Fmt(Num(j, "p99_ttft_ms")),
                    Fmt(Num(j, "median_tpot_ms")) + " / " + Fmt(Num(j, "p99_tpot_ms")),
                    Fmt(Num(j, "median_itl_ms")) + " / " + Fmt(Num(j, "p99_itl_ms")),
                    Fmt(Num(j, "median_e2el_ms")) + " / " + Fmt(Num(j, "p99_e2el_ms")), Str(j, "date")});
  }
  out += Table({"run", "model", "concurrency", "rate (req/s)", "ok / failed", "duration (s)", "req/s",
                "output tok/s", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)", "ITL p50 / p99 (ms)",
                "E2EL p50 / p99 (ms)", "date"},
               rows);
  out += "<div class=\"grid2\">";
  out += BarChart("Output token throughput", "tokens/s", cats, series("output_throughput", nullptr, ""));
  out += BarChart("Request throughput", "requests/s", cats, series("request_throughput", nullptr, ""));
  const std::string note = "bar: median, whisker: p99";
  out += BarChart("Time to first token", "ms", cats, series("median_ttft_ms", "p99_ttft_ms", ""), note);
  out += BarChart("Time per output token", "ms", cats, series("median_tpot_ms", "p99_tpot_ms", ""), note);
  out += BarChart("Inter-token latency", "ms", cats, series("median_itl_ms", "p99_itl_ms", ""), note);
  out += BarChart("End-to-end latency", "ms", cats, series("median_e2el_ms", "p99_e2el_ms", ""), note);
  auto cdf = [&](const char* key, const char* title) {
    std::vector<std::pair<std::string, std::vector<double>>> curves;
    for (const ReportRun* r : runs) {
      std::vector<double> v = Samples(r->result, key, 1000.0);
      if (v.empty()) continue;
      curves.emplace_back(r->label + " · c=" + Str(r->result, "max_concurrency"), std::move(v));
    }
    if (!curves.empty()) out += CdfChart(title, curves);
  };
  cdf("ttfts", "TTFT distribution (CDF)");
  cdf("e2els", "End-to-end latency distribution (CDF)");
  cdf("itls", "Inter-token latency distribution (CDF, pooled)");
  out += "</div></section>\n";
  return out;
}

std::string ModelSection(const std::vector<const ReportRun*>& runs) {
  std::string out = "<section><h2>Model benchmark (bench)</h2>\n";
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> cats;
  for (const ReportRun* r : runs) {
    for (const Json& row : r->result["results"]) {
      const std::string cat = Str(row, "test") + " · b" + Str(row, "batch");
      if (std::find(cats.begin(), cats.end(), cat) == cats.end()) cats.push_back(cat);
      const double pf = Num(row, "peak_fraction");
      rows.push_back({r->label, Str(r->result, "model"), Str(r->result, "threads"), Str(row, "test"),
                      Str(row, "batch"),
                      Fmt(Num(row, "tokens_per_s_mean")) + " ± " + Fmt(Num(row, "tokens_per_s_stddev")),
                      Fmt(Num(row, "gflops")), std::isfinite(pf) ? Fmt(100 * pf) + "%" : "–",
                      Fmt(Num(row, "load_avg_1m"))});
    }
  }
  out += Table({"run", "model", "threads", "test", "batch", "tokens/s (mean ± sd)", "GFLOP/s",
                "of FMA peak", "load avg (1 min)"},
               rows);
  std::vector<Series> series;
  for (const ReportRun* r : runs) {
    Series s{r->label, std::vector<double>(cats.size(), kNaN), std::vector<double>(cats.size(), kNaN)};
    for (const Json& row : r->result["results"]) {
      const std::string cat = Str(row, "test") + " · b" + Str(row, "batch");
      const size_t c = std::find(cats.begin(), cats.end(), cat) - cats.begin();
      s.values[c] = Num(row, "tokens_per_s_mean");
      const double sd = Num(row, "tokens_per_s_stddev");
      if (std::isfinite(sd) && sd > 0) s.whiskers[c] = s.values[c] + sd;
    }
    series.push_back(std::move(s));
  }
  out += "<div class=\"grid2\">";
  out += BarChart("Throughput", "tokens/s", cats, series, "whisker: mean + 1 sd");
  std::vector<std::pair<std::string, double>> bw;
  for (const ReportRun* r : runs) {
    const double f = Num(r->result, "tg_bandwidth_fraction");
    if (std::isfinite(f))
      bw.emplace_back(r->label + " · tg b1 (" + Fmt(Num(r->result, "tg_weight_read_gbs")) + " of " +
                          Fmt(Num(r->result, "read_bandwidth_gbs")) + " GB/s)",
                      f);
  }
  if (!bw.empty()) out += FractionBars("Decode: fraction of the measured read bandwidth", bw);
  std::vector<std::pair<std::string, double>> peak;
  for (const ReportRun* r : runs) {
    for (const Json& row : r->result["results"]) {
      const double f = Num(row, "peak_fraction");
      if (std::isfinite(f)) peak.emplace_back(r->label + " · " + Str(row, "test") + " b" + Str(row, "batch"), f);
    }
  }
  if (!peak.empty()) out += FractionBars("Prefill: fraction of the measured f32 FMA peak", peak);
  out += "</div></section>\n";
  return out;
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#1d2330;background:#f6f7f9}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px}.sub{color:#667085;font-size:13px}
table{border-collapse:collapse;font-size:12px;background:#fff;margin:8px 0;display:block;overflow-x:auto}
th,td{border:1px solid #e2e5ea;padding:4px 8px;text-align:right;white-space:nowrap}th{background:#eef0f4}
td:first-child,th:first-child{text-align:left}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.chart{margin:0;background:#fff;border:1px solid #e2e5ea;border-radius:10px;padding:10px 12px}
.chart figcaption{font-weight:600;font-size:13px;margin-bottom:4px}.chart svg{width:100%;height:auto;display:block}
.grid{stroke:#eceef2}.tick,.cat{fill:#667085;font-size:11px}.val{fill:#1d2330;font-size:10px}
.whisker{stroke:#1d2330;stroke-width:1.2}.cdf{fill:none;stroke-width:1.8}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;color:#667085}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px}
.note{font-style:italic}
)";

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string BenchReportHtml(const std::vector<ReportRun>& runs, const std::string& title) {
  std::vector<const ReportRun*> serve, model;
  for (const ReportRun& r : runs) {
    if (IsServe(r.result)) serve.push_back(&r);
    else if (IsModel(r.result)) model.push_back(&r);
  }
  char date[40];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  std::string html =
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src "
      "'unsafe-inline'\"><title>" +
      HtmlEscape(title) + "</title><style>" + kStyle + "</style></head><body>\n<h1>" + HtmlEscape(title) +
      "</h1><div class=\"sub\">deepharness benchmark report · generated " + date + " · " +
      std::to_string(runs.size()) + " result(s)</div>\n";
  if (!model.empty()) html += ModelSection(model);
  if (!serve.empty()) html += ServeSection(serve);
  if (model.empty() && serve.empty()) html += "<p>No benchmark results.</p>";
  html += "</body></html>\n";
  return html;
}

Result<std::vector<ReportRun>> LoadReportRuns(const std::vector<std::string>& paths) {
  std::vector<ReportRun> runs;
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return NotFound("{}: cannot open the result file", path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    Json j = Json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgument("{}: expected a JSON benchmark result", path);
    std::vector<Json> items;
    if (j.is_array()) items.assign(j.begin(), j.end());
    else items.push_back(j);
    const std::string label = std::filesystem::path(path).stem().string();
    for (Json& item : items) {
      if (!IsServe(item) && !IsModel(item)) {
        return InvalidArgument("{}: expected the JSON of `bench --json` (\"results\") or `bench serve "
                               "--json` (\"request_throughput\")",
                               path);
      }
      runs.push_back({label, std::move(item)});
    }
  }
  return runs;
}

Status CheckReportPath(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return InvalidArgument("--report: {}: the folder {} does not exist", path, dir.string());
  if (std::filesystem::is_directory(path, ec))
    return InvalidArgument("--report: {}: is a folder, expected a file name", path);
  return Status::Ok();
}

Status WriteReportFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError("{}: cannot write the report", path);
  out << text;
  out.close();
  if (!out) return IoError("{}: cannot write the report", path);
  return Status::Ok();
}

}  // namespace dh::tools
