// Profile tables (profile.h).
#include "tools/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dh::tools {
namespace {

enum class GroupBy { kOp, kLabel, kKernel };

std::vector<ProfileRow> Group(const std::vector<OpTotalsRow>& rows, GroupBy by, double op_seconds,
                              double bandwidth_gbs, double peak_gflops) {
  std::map<std::string, OpTotals> groups;
  for (const OpTotalsRow& r : rows) {
    switch (by) {
      case GroupBy::kOp: groups[r.op].Add(r.totals); break;
      case GroupBy::kLabel: groups[r.label.empty() ? "other" : r.label].Add(r.totals); break;
      case GroupBy::kKernel:
        groups[r.kernel.empty() ? r.op : r.op + " " + r.kernel].Add(r.totals);
        break;
    }
  }
  std::vector<ProfileRow> out;
  for (const auto& [name, t] : groups) {
    ProfileRow row;
    row.name = name;
    row.totals = t;
    row.share = op_seconds > 0 ? t.seconds / op_seconds : 0;
    if (t.seconds > 0) {
      row.gbs = t.bytes / t.seconds / 1e9;
      row.gflops = t.flops / t.seconds / 1e9;
    }
    if (bandwidth_gbs > 0) row.bandwidth_fraction = row.gbs / bandwidth_gbs;
    if (peak_gflops > 0) row.peak_fraction = row.gflops / peak_gflops;
    out.push_back(row);
  }
  std::sort(out.begin(), out.end(), [](const ProfileRow& a, const ProfileRow& b) {
    return a.totals.seconds > b.totals.seconds;
  });
  return out;
}

std::string Percent(double fraction) {
  return fraction < 0 ? std::string("-") : fmt::format("{:.1f}%", 100 * fraction);
}

std::string Table(const std::string& title, const std::vector<ProfileRow>& rows) {
  size_t width = title.size();
  for (const ProfileRow& r : rows) width = std::max(width, r.name.size());
  std::string out =
      fmt::format("{:<{}}  {:>7}  {:>10}  {:>9}  {:>6}  {:>8}  {:>6}  {:>9}  {:>6}\n", title, width,
                  "calls", "total ms", "mean us", "share", "GB/s", "of bw", "GFLOP/s", "of peak");
  for (const ProfileRow& r : rows) {
    out += fmt::format(
        "{:<{}}  {:>7}  {:>10.3f}  {:>9.2f}  {:>6}  {:>8.2f}  {:>6}  {:>9.2f}  {:>6}\n", r.name,
        width, r.totals.calls, r.totals.seconds * 1e3,
        r.totals.calls ? r.totals.seconds * 1e6 / r.totals.calls : 0.0, Percent(r.share), r.gbs,
        Percent(r.bandwidth_fraction), r.gflops, Percent(r.peak_fraction));
  }
  return out;
}

nlohmann::json RowsJson(const std::vector<ProfileRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const ProfileRow& r : rows) {
    nlohmann::json j = {{"name", r.name},
                        {"calls", r.totals.calls},
                        {"seconds", r.totals.seconds},
                        {"bytes", r.totals.bytes},
                        {"flops", r.totals.flops},
                        {"share", r.share},
                        {"gbs", r.gbs},
                        {"gflops", r.gflops}};
    if (r.bandwidth_fraction >= 0) j["bandwidth_fraction"] = r.bandwidth_fraction;
    if (r.peak_fraction >= 0) j["peak_fraction"] = r.peak_fraction;
    out.push_back(j);
  }
  return out;
}

}  // namespace

ProfilePhase SummarizeProfile(const std::string& name, double wall_seconds,
                              const std::vector<OpTotalsRow>& rows, double bandwidth_gbs,
                              double peak_gflops) {
  ProfilePhase p;
  p.name = name;
  p.wall_seconds = wall_seconds;
  for (const OpTotalsRow& r : rows) p.op_seconds += r.totals.seconds;
  p.by_op = Group(rows, GroupBy::kOp, p.op_seconds, bandwidth_gbs, peak_gflops);
  p.by_layer = Group(rows, GroupBy::kLabel, p.op_seconds, bandwidth_gbs, peak_gflops);
  p.by_kernel = Group(rows, GroupBy::kKernel, p.op_seconds, bandwidth_gbs, peak_gflops);
  return p;
}

std::string FormatProfile(const ProfileReport& r) {
  std::string out = fmt::format("profile of {}\n", r.label);
  out += fmt::format("machine: read bandwidth {}, f32 FMA peak {}\n",
                     r.bandwidth_gbs > 0 ? fmt::format("{:.1f} GB/s", r.bandwidth_gbs) : "-",
                     r.peak_gflops > 0 ? fmt::format("{:.1f} GFLOP/s", r.peak_gflops) : "-");
  for (const ProfilePhase& p : r.phases) {
    out +=
        fmt::format("\n{}: {:.3f} s wall, {:.3f} s in ops ({})\n", p.name, p.wall_seconds,
                    p.op_seconds, Percent(p.wall_seconds > 0 ? p.op_seconds / p.wall_seconds : -1));
    out += Table("op", p.by_op);
    out += "\n";
    out += Table("layer type", p.by_layer);
    out += "\n";
    out += Table("op and kernel", p.by_kernel);
  }
  return out;
}

nlohmann::json ProfileJson(const ProfileReport& r) {
  nlohmann::json j = {{"label", r.label}};
  if (r.bandwidth_gbs > 0) j["bandwidth_gbs"] = r.bandwidth_gbs;
  if (r.peak_gflops > 0) j["peak_gflops"] = r.peak_gflops;
  j["phases"] = nlohmann::json::array();
  for (const ProfilePhase& p : r.phases) {
    j["phases"].push_back({{"name", p.name},
                           {"wall_seconds", p.wall_seconds},
                           {"op_seconds", p.op_seconds},
                           {"by_op", RowsJson(p.by_op)},
                           {"by_layer", RowsJson(p.by_layer)},
                           {"by_kernel", RowsJson(p.by_kernel)}});
  }
  return j;
}

}  // namespace dh::tools
