// DiffDumps and FormatDumpDiff (dump_diff.h).
#include "tools/dump_diff.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <map>

#include "base/mapped_file.h"
#include "io/npy.h"

namespace dh {
namespace {

struct ManifestEntry {
  int step = 0;
  std::string tap, dtype, shape, file;
};

std::vector<std::string_view> SplitTabs(std::string_view line) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) return out;
    start = tab + 1;
  }
}

Result<std::vector<ManifestEntry>> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/manifest.tsv";
  DH_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  std::vector<ManifestEntry> entries;
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (++line_no == 1) {
      if (line != "step\ttap\tdtype\tshape\tfile") {
        return InvalidArgument("{}: line 1: expected the header 'step tap dtype shape file'", path);
      }
      continue;
    }
    if (line.empty()) continue;
    const auto f = SplitTabs(line);
    ManifestEntry e;
    if (f.size() != 5) {
      return InvalidArgument("{}: line {}: expected 5 tab-separated fields, got {}", path, line_no,
                             f.size());
    }
    auto [p, ec] = std::from_chars(f[0].data(), f[0].data() + f[0].size(), e.step);
    if (ec != std::errc() || p != f[0].data() + f[0].size() || e.step < 0) {
      return InvalidArgument("{}: line {}: field 'step': '{}' is not a step number", path, line_no,
                             f[0]);
    }
    e.tap = f[1];
    e.dtype = f[2];
    e.shape = f[3];
    e.file = f[4];
    if (e.file.empty() || e.file.find('/') != std::string::npos || e.file[0] == '.') {
      return InvalidArgument("{}: line {}: field 'file': '{}' is not a file name in the dump", path,
                             line_no, e.file);
    }
    entries.push_back(std::move(e));
  }
  if (line_no == 0) return InvalidArgument("{}: empty manifest", path);
  return entries;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

template <typename T>
void CompareValues(const T* a, const T* b, int64_t n, const DumpDiffOptions& o, TapDiff* d) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    bool close;
    double err;
    if (std::isnan(x) || std::isnan(y)) {
      close = false;
      err = INFINITY;
    } else if (std::isinf(x) || std::isinf(y)) {
      close = x == y;
      err = close ? 0.0 : INFINITY;
    } else {
      err = std::fabs(x - y);
      close = err <= o.atol + o.rtol * std::fabs(y);
    }
    if (!close) ++d->mismatched;
    d->max_abs = std::max(d->max_abs, err);
    if (y != 0) d->max_rel = std::max(d->max_rel, err / std::fabs(y));
  }
}

Result<TapDiff> CompareTap(const ManifestEntry& ea, const std::string& dir_a,
                           const ManifestEntry& eb, const std::string& dir_b,
                           const DumpDiffOptions& o) {
  TapDiff d;
  d.step = ea.step;
  d.tap = ea.tap;
  DH_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(dir_a + "/" + ea.file));
  DH_ASSIGN_OR_RETURN(NpyArray b, ReadNpy(dir_b + "/" + eb.file));
  d.shape = ShapeText(a.shape);
  if (a.dtype != b.dtype) {
    return InvalidArgument("tap {} of step {}: dtype {} in {} but {} in {}", ea.tap, ea.step,
                           DTypeName(a.dtype), dir_a, DTypeName(b.dtype), dir_b);
  }
  if (a.shape != b.shape) {
    d.shape += " vs " + ShapeText(b.shape);
    d.verdict = TapDiff::Verdict::kShapeDiffers;
    return d;
  }
  int64_t n = 1;
  for (int64_t v : a.shape) n *= v;
  d.elements = n;
  switch (a.dtype) {
    case DType::kF32:
      CompareValues(a.as<float>(), b.as<float>(), n, o, &d);
      break;
    case DType::kI32:
      CompareValues(a.as<int32_t>(), b.as<int32_t>(), n, {0, 0}, &d);
      break;
    case DType::kI64:
      CompareValues(a.as<int64_t>(), b.as<int64_t>(), n, {0, 0}, &d);
      break;
    default:
      return InvalidArgument("{}/{}: dtype {} is not compared", dir_a, ea.file, DTypeName(a.dtype));
  }
  d.verdict = d.mismatched > 0 ? TapDiff::Verdict::kDiffers : TapDiff::Verdict::kSame;
  return d;
}

std::string Key(int step, const std::string& tap) { return fmt::format("s{}.{}", step, tap); }

}  // namespace

Result<DumpDiff> DiffDumps(const std::string& dir_a, const std::string& dir_b,
                           const DumpDiffOptions& o) {
  if (!(o.rtol >= 0) || !(o.atol >= 0)) {
    return InvalidArgument("--rtol and --atol: expected non-negative numbers");
  }
  DH_ASSIGN_OR_RETURN(std::vector<ManifestEntry> a, ReadManifest(dir_a));
  DH_ASSIGN_OR_RETURN(std::vector<ManifestEntry> b, ReadManifest(dir_b));
  std::map<std::string, const ManifestEntry*> in_b;
  for (const ManifestEntry& e : b) in_b[Key(e.step, e.tap)] = &e;
  DumpDiff diff;
  for (const ManifestEntry& ea : a) {
    const std::string key = Key(ea.step, ea.tap);
    auto it = in_b.find(key);
    if (it == in_b.end()) {
      diff.only_in_a.push_back(key);
      continue;
    }
    DH_ASSIGN_OR_RETURN(TapDiff d, CompareTap(ea, dir_a, *it->second, dir_b, o));
    in_b.erase(it);
    if (d.verdict != TapDiff::Verdict::kSame && diff.first_difference < 0) {
      diff.first_difference = static_cast<int>(diff.taps.size());
    }
    diff.taps.push_back(std::move(d));
  }
  for (const ManifestEntry& e : b) {
    if (in_b.count(Key(e.step, e.tap))) diff.only_in_b.push_back(Key(e.step, e.tap));
  }
  if (diff.taps.empty()) {
    return InvalidArgument("{} and {} have no tap of the same step and name in common", dir_a,
                           dir_b);
  }
  return diff;
}

std::string FormatDumpDiff(const DumpDiff& diff, const DumpDiffOptions& o) {
  size_t width = 3;
  for (const TapDiff& d : diff.taps) width = std::max(width, d.tap.size());
  std::string out = fmt::format("{:>4}  {:<{}}  {:<14}  {:>10}  {:>10}  {:>9}  {}\n", "step", "tap",
                                width, "shape", "max_abs", "max_rel", "mismatch", "verdict");
  for (const TapDiff& d : diff.taps) {
    const char* verdict = "ok";
    switch (d.verdict) {
      case TapDiff::Verdict::kSame:
        break;
      case TapDiff::Verdict::kDiffers:
        verdict = "DIFFERS";
        break;
      case TapDiff::Verdict::kShapeDiffers:
        verdict = "SHAPE DIFFERS";
        break;
    }
    out += fmt::format("{:>4}  {:<{}}  {:<14}  {:>10.3e}  {:>10.3e}  {:>9}  {}\n", d.step, d.tap,
                       width, d.shape, d.max_abs, d.max_rel, d.mismatched, verdict);
  }
  for (const std::string& k : diff.only_in_a) out += fmt::format("only in A: {}\n", k);
  for (const std::string& k : diff.only_in_b) out += fmt::format("only in B: {}\n", k);
  if (diff.same()) {
    out += fmt::format("all {} taps in both dumps match (rtol {:g}, atol {:g})\n", diff.taps.size(),
                       o.rtol, o.atol);
  } else {
    const TapDiff& d = diff.taps[static_cast<size_t>(diff.first_difference)];
    out += fmt::format("first differing tap: step {} {}", d.step, d.tap);
    if (d.verdict == TapDiff::Verdict::kDiffers) {
      out += fmt::format(" ({} of {} elements beyond rtol {:g}, atol {:g}; max abs error {:.3e})",
                         d.mismatched, d.elements, o.rtol, o.atol, d.max_abs);
    }
    out += "\n";
  }
  return out;
}

}  // namespace dh
