// HTML benchmark reports: escaping of every input text, the charts each kind of result gets,
// several concurrency levels and runs side by side, no scripts, and file loading errors.
#include "tools/report_html.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace dh::tools {
namespace {

using Json = nlohmann::json;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

Json ServeResult(int concurrency, double tput) {
  return {{"model_id", "m<script>"}, {"max_concurrency", concurrency}, {"request_rate", "inf"},
          {"completed", 8}, {"failed", 0}, {"duration", 1.5}, {"request_throughput", tput / 10},
          {"output_throughput", tput}, {"median_ttft_ms", 12.0}, {"p99_ttft_ms", 30.0},
          {"median_tpot_ms", 2.0}, {"p99_tpot_ms", 3.0}, {"median_itl_ms", 2.0}, {"p99_itl_ms", 4.0},
          {"median_e2el_ms", 80.0}, {"p99_e2el_ms", 120.0}, {"ttfts", {0.01, 0.012, 0.03}},
          {"e2els", {0.07, 0.08, 0.12}}, {"itls", {{0.002, 0.003}, {0.004}}}};
}

Json ModelResult() {
  return {{"model", "tiny"}, {"threads", 2}, {"read_bandwidth_gbs", 40.0}, {"tg_weight_read_gbs", 10.0},
          {"tg_bandwidth_fraction", 0.25},
          {"results",
           {{{"test", "pp512"}, {"batch", 1}, {"tokens_per_s_mean", 300.0}, {"tokens_per_s_stddev", 5.0},
             {"gflops", 50.0}, {"peak_fraction", 0.4}, {"load_avg_1m", 1.0}},
            {{"test", "tg128"}, {"batch", 1}, {"tokens_per_s_mean", 90.0}, {"tokens_per_s_stddev", 1.0},
             {"gflops", nullptr}, {"peak_fraction", nullptr}, {"load_avg_1m", 1.0}}}}};
}

TEST(ReportHtmlTest, EscapesText) {
  EXPECT_EQ(HtmlEscape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

TEST(ReportHtmlTest, ServeRunsPerConcurrencyLevelAndSideBySide) {
  std::vector<ReportRun> runs = {{"base<img onerror=x>", ServeResult(1, 100)},
                                 {"base<img onerror=x>", ServeResult(4, 300)},
                                 {"new", ServeResult(1, 120)},
                                 {"new", ServeResult(4, 380)}};
  const std::string html = BenchReportHtml(runs, "t<script>alert(1)</script>");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<img"), std::string::npos);
  EXPECT_NE(html.find("t&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("base&lt;img onerror=x&gt;"), std::string::npos);
  EXPECT_NE(html.find("m&lt;script&gt;"), std::string::npos);
  // 6 bar charts + 3 CDFs (TTFT, E2EL, ITL).
  EXPECT_EQ(Count(html, "<svg "), 9u);
  EXPECT_EQ(Count(html, "class=\"cdf\""), 12u);  // 4 runs x 3 distributions
  EXPECT_NE(html.find(">concurrency 1<"), std::string::npos);
  EXPECT_NE(html.find(">concurrency 4<"), std::string::npos);
  // One bar per run and level in each bar chart: 6 charts x 4 bars.
  EXPECT_EQ(Count(html, "<rect "), 24u);
  EXPECT_NE(html.find("<title>new · concurrency 4: 380.0</title></rect>"), std::string::npos);
  EXPECT_NE(html.find("380"), std::string::npos);
  EXPECT_EQ(Count(html, "<tr>"), 5u);  // header + 4 runs
}

TEST(ReportHtmlTest, ModelRunWithBandwidthAndPeakFractions) {
  const std::string html = BenchReportHtml({{"cpu", ModelResult()}}, "bench");
  EXPECT_NE(html.find("Model benchmark"), std::string::npos);
  EXPECT_EQ(html.find("Serving benchmark"), std::string::npos);
  EXPECT_NE(html.find("fraction of the measured read bandwidth"), std::string::npos);
  EXPECT_NE(html.find(">25.0%<"), std::string::npos);
  EXPECT_NE(html.find(">40.0%<"), std::string::npos);
  EXPECT_NE(html.find("300.0 ± 5.00"), std::string::npos);
  EXPECT_EQ(Count(html, "<svg "), 3u);
}

TEST(ReportHtmlTest, LoadsObjectsAndArraysAndNamesBadFiles) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dh-report-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.json") << Json::array({ServeResult(1, 1), ServeResult(2, 2)}).dump();
  std::ofstream(dir / "b.json") << ModelResult().dump();
  std::ofstream(dir / "bad.json") << "{\"x\": 1}";
  std::ofstream(dir / "broken.json") << "{";
  auto runs = LoadReportRuns({(dir / "a.json").string(), (dir / "b.json").string()});
  ASSERT_TRUE(runs.ok()) << runs.status().message();
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[0].label, "a");
  EXPECT_EQ((*runs)[2].label, "b");
  auto bad = LoadReportRuns({(dir / "bad.json").string()});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.json"), std::string::npos);
  auto broken = LoadReportRuns({(dir / "broken.json").string()});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("broken.json"), std::string::npos);
  EXPECT_FALSE(LoadReportRuns({(dir / "missing.json").string()}).ok());
  const std::string html = BenchReportHtml(*runs, "both");
  EXPECT_NE(html.find("Model benchmark"), std::string::npos);
  EXPECT_NE(html.find("Serving benchmark"), std::string::npos);
  EXPECT_FALSE(WriteReportFile((dir / "no" / "such" / "dir.html").string(), html).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dh::tools
