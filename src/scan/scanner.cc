#include "scan/scanner.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <unordered_map>

#include "base/thread_pool.h"

namespace dh::scan {
namespace {

namespace fs = std::filesystem;

struct Entry {
  const Rule* rule;
  const Pattern* pattern;
};

constexpr int kNumKinds = static_cast<int>(PatternKind::kFrom) + 1;

// Patterns by kind, bucketed by their first character ('*'/'#'-led patterns are in every bucket's
// fallback list).
struct Index {
  std::array<std::array<std::vector<Entry>, 256>, kNumKinds> by_first;
  std::array<std::vector<Entry>, kNumKinds> wild;
};

const Index& GetIndex() {
  static const Index index = [] {
    Index idx;
    for (const Rule& r : Rules()) {
      for (const Pattern& p : r.patterns) {
        const int k = static_cast<int>(p.kind);
        const unsigned char first = p.glob.empty() ? 0 : static_cast<unsigned char>(p.glob[0]);
        if (first == '*' || first == '#' || first == 0) {
          idx.wild[k].push_back({&r, &p});
        } else {
          idx.by_first[k][first].push_back({&r, &p});
        }
      }
    }
    return idx;
  }();
  return index;
}

// The most specific rule whose pattern of this kind matches text (nullptr if none).
void BestMatch(PatternKind kind, std::string_view text, const Entry** best) {
  if (text.empty()) return;
  const Index& idx = GetIndex();
  const int k = static_cast<int>(kind);
  auto consider = [&](const std::vector<Entry>& list) {
    for (const Entry& e : list) {
      if (*best != nullptr && (*best)->pattern->specificity >= e.pattern->specificity) continue;
      if (GlobMatch(e.pattern->glob, text)) *best = &e;
    }
  };
  consider(idx.by_first[k][static_cast<unsigned char>(text[0])]);
  consider(idx.wild[k]);
}

const Entry* MatchAtom(const Atom& a, FileClass cls) {
  const Entry* best = nullptr;
  switch (a.kind) {
    case PatternKind::kPyName: {
      // The name itself and each dotted prefix: "flash_attn.ops.x" matches "flash_attn".
      std::string_view name = a.text;
      while (true) {
        BestMatch(PatternKind::kPyName, name, &best);
        const size_t dot = name.rfind('.');
        if (dot == std::string_view::npos) break;
        name = name.substr(0, dot);
      }
      break;
    }
    case PatternKind::kPyString: {
      std::string_view s = a.text;
      if (s.size() > 512) break;
      const size_t blank = s.find_first_of(" \t\n");
      if (blank == std::string_view::npos) BestMatch(PatternKind::kPyString, s, &best);
      BestMatch(PatternKind::kPyCommand, s.substr(0, blank), &best);  // a command's first word
      break;
    }
    case PatternKind::kC: {
      BestMatch(PatternKind::kC, a.text, &best);
      if (cls == FileClass::kCuda) BestMatch(PatternKind::kCuda, a.text, &best);
      const size_t sep = a.text.rfind("::");
      if (best == nullptr && sep != std::string::npos) {
        const std::string_view last = std::string_view(a.text).substr(sep + 2);
        BestMatch(PatternKind::kC, last, &best);
        if (cls == FileClass::kCuda) BestMatch(PatternKind::kCuda, last, &best);
      }
      break;
    }
    default: BestMatch(a.kind, a.text, &best); break;
  }
  return best;
}

// Inline suppression: "deepharness: ignore" (all rules) or "deepharness: ignore[PY01,CC02]".
// Returns true when the comment suppresses rule_id.
bool CommentSuppresses(std::string_view comment, std::string_view rule_id) {
  static constexpr std::string_view kTag = "deepharness: ignore";
  size_t p = comment.find(kTag);
  while (p != std::string_view::npos) {
    size_t q = p + kTag.size();
    if (comment.substr(q, 5) == "-file") {
      p = comment.find(kTag, q);
      continue;
    }
    if (q >= comment.size() || comment[q] != '[') return true;
    const size_t close = comment.find(']', q);
    std::string_view list = comment.substr(q + 1, close == std::string_view::npos
                                                      ? std::string_view::npos
                                                      : close - q - 1);
    while (!list.empty()) {
      const size_t comma = list.find(',');
      std::string_view id = list.substr(0, comma);
      while (!id.empty() && id.front() == ' ') id.remove_prefix(1);
      while (!id.empty() && id.back() == ' ') id.remove_suffix(1);
      if (GlobMatch(id, rule_id)) return true;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
    p = comment.find(kTag, q);
  }
  return false;
}

int CodePointColumn(std::string_view line, int byte_col) {
  int n = 1;
  for (int k = 0; k < byte_col - 1 && k < static_cast<int>(line.size()); ++k) {
    if ((static_cast<unsigned char>(line[k]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

bool ExcludedBy(const std::vector<std::string>& globs, const std::string& rel) {
  if (globs.empty()) return false;
  for (const std::string& g : globs) {
    if (GlobMatch(g, rel)) return true;
    size_t s = 0;
    while (s <= rel.size()) {
      size_t e = rel.find('/', s);
      if (e == std::string::npos) e = rel.size();
      if (GlobMatch(g, std::string_view(rel).substr(s, e - s))) return true;
      s = e + 1;
    }
  }
  return false;
}

bool RuleDisabled(const std::vector<std::string>& globs, const std::string& id) {
  for (const std::string& g : globs) {
    if (GlobMatch(g, id)) return true;
  }
  return false;
}

bool SkipDir(const std::string& name) {
  return name == ".git" || name == ".hg" || name == ".svn" || name == "node_modules" ||
         name == "__pycache__" || name == ".venv" || name == ".tox" || name == ".mypy_cache";
}

}  // namespace

std::vector<Finding> ScanText(const std::string& display_path, FileClass cls,
                              const std::string& text, int* suppressed, int* lines) {
  std::vector<Finding> out;
  LexResult lex = Lex(cls, text);
  if (lines != nullptr) *lines = lex.lines;
  if (lex.atoms.empty()) return out;
  bool ignore_file = false;
  std::unordered_map<int, std::vector<const Comment*>> comments_by_line;
  for (const Comment& c : lex.comments) {
    if (c.text.find("deepharness: ignore-file") != std::string::npos) ignore_file = true;
    comments_by_line[c.line].push_back(&c);
  }
  std::vector<size_t> line_starts;
  std::set<std::tuple<const Rule*, int, int>> seen;
  for (const Atom& a : lex.atoms) {
    const Entry* e = MatchAtom(a, cls);
    if (e == nullptr) continue;
    if (!seen.insert({e->rule, a.line, a.col}).second) continue;
    bool quiet = ignore_file;
    if (!quiet) {
      if (auto it = comments_by_line.find(a.line); it != comments_by_line.end()) {
        for (const Comment* c : it->second) quiet = quiet || CommentSuppresses(c->text, e->rule->id);
      }
      if (auto it = comments_by_line.find(a.line - 1); !quiet && it != comments_by_line.end()) {
        for (const Comment* c : it->second) {
          quiet = quiet || (c->own_line && CommentSuppresses(c->text, e->rule->id));
        }
      }
    }
    if (quiet) {
      if (suppressed != nullptr) ++*suppressed;
      continue;
    }
    if (line_starts.empty()) {
      line_starts.push_back(0);
      for (size_t k = 0; k < text.size(); ++k) {
        if (text[k] == '\n') line_starts.push_back(k + 1);
      }
    }
    Finding f;
    f.rule = e->rule;
    f.path = display_path;
    f.line = a.line;
    f.col = a.col;
    f.symbol = a.symbol.empty() ? a.text : a.symbol;
    if (f.symbol.size() > 200) f.symbol.resize(200);
    if (a.kind == PatternKind::kPyName || a.kind == PatternKind::kReq) {
      f.unit = f.symbol.substr(0, f.symbol.find('.'));
      std::replace(f.unit.begin(), f.unit.end(), '-', '_');
    } else if (e->rule->id == "CC06") {
      f.unit = a.symbol;  // only the __global__ hits name a kernel
    } else {
      f.unit = f.symbol;
    }
    if (a.line >= 1 && static_cast<size_t>(a.line) <= line_starts.size()) {
      const size_t s = line_starts[a.line - 1];
      size_t e2 = text.find('\n', s);
      if (e2 == std::string::npos) e2 = text.size();
      std::string_view l = std::string_view(text).substr(s, e2 - s);
      f.char_col = CodePointColumn(l, a.col);
      while (!l.empty() && (l.front() == ' ' || l.front() == '\t')) l.remove_prefix(1);
      while (!l.empty() && (l.back() == ' ' || l.back() == '\t' || l.back() == '\r')) {
        l.remove_suffix(1);
      }
      f.code = std::string(l.substr(0, 200));
    } else {
      f.char_col = a.col;
    }
    out.push_back(std::move(f));
  }
  std::stable_sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) {
    return a.line != b.line ? a.line < b.line : a.col < b.col;
  });
  return out;
}

Result<ScanReport> ScanPaths(const std::vector<std::string>& paths, const ScanOptions& options) {
  struct Job {
    std::string file, display;
    FileClass cls;
  };
  std::vector<Job> jobs;
  ScanReport report;
  report.target = options.target;
  for (const std::string& root : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(root, ec);
    if (ec || !fs::exists(st)) return NotFound("{}: no such file or directory", root);
    if (fs::is_regular_file(st)) {
      const FileClass cls = ClassifyPath(root);
      if (cls != FileClass::kOther) jobs.push_back({root, root, cls});
      continue;
    }
    if (!fs::is_directory(st)) return InvalidArgument("{}: expected a file or a directory", root);
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
    if (ec) return IoError("{}: {}", root, ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) {
        report.warnings.push_back(fmt::format("{}: {}", root, ec.message()));
        break;
      }
      const fs::directory_entry& de = *it;
      const std::string name = de.path().filename().string();
      const std::string rel = fs::relative(de.path(), root, ec).generic_string();
      if (de.is_directory(ec)) {
        if (SkipDir(name) || ExcludedBy(options.excludes, rel)) it.disable_recursion_pending();
        continue;
      }
      if (!de.is_regular_file(ec) || ExcludedBy(options.excludes, rel)) continue;
      const FileClass cls = ClassifyPath(name);
      if (cls == FileClass::kOther) continue;
      std::string display = (fs::path(root) / rel).lexically_normal().generic_string();
      if (display.rfind("./", 0) == 0) display = display.substr(2);
      jobs.push_back({de.path().string(), std::move(display), cls});
    }
  }
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.display < b.display; });

  std::mutex mu;
  const int threads = options.jobs > 0 ? options.jobs : AvailableCpus();
  ThreadPool pool(std::max(1, std::min(threads, 64)));
  std::vector<std::vector<Finding>> per_file(jobs.size());
  pool.ParallelFor(jobs.size(), 8, [&](size_t begin, size_t end) {
    int scanned = 0, skipped = 0, suppressed = 0;
    uint64_t bytes = 0, lines_total = 0;
    std::map<std::string, int> classes;
    std::vector<std::string> warnings;
    std::string text;
    for (size_t i = begin; i < end; ++i) {
      const Job& job = jobs[i];
      std::FILE* f = std::fopen(job.file.c_str(), "rb");
      if (f == nullptr) {
        ++skipped;
        warnings.push_back(fmt::format("{}: cannot open", job.display));
        continue;
      }
      text.clear();
      char buf[65536];
      size_t n;
      bool too_big = false;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
        if (text.size() + n > options.max_file_bytes) {
          too_big = true;
          break;
        }
        text.append(buf, n);
      }
      std::fclose(f);
      if (too_big || text.find('\0') != std::string::npos) {
        ++skipped;
        continue;
      }
      int lines = 0;
      per_file[i] = ScanText(job.display, job.cls, text, &suppressed, &lines);
      ++scanned;
      bytes += text.size();
      lines_total += static_cast<uint64_t>(lines);
      ++classes[FileClassName(job.cls)];
    }
    std::lock_guard<std::mutex> lock(mu);
    report.files_scanned += scanned;
    report.files_skipped += skipped;
    report.suppressed += suppressed;
    report.bytes_scanned += bytes;
    report.lines_scanned += lines_total;
    for (const auto& [k, v] : classes) report.files_by_class[k] += v;
    for (std::string& w : warnings) report.warnings.push_back(std::move(w));
  });
  for (auto& v : per_file) {
    for (Finding& f : v) {
      if (!RuleDisabled(options.disabled, f.rule->id)) report.findings.push_back(std::move(f));
    }
  }
  std::sort(report.warnings.begin(), report.warnings.end());
  Summarize(&report);
  return report;
}

std::string FormatBaseline(const std::vector<Finding>& findings) {
  std::string out = "# deepharness scan baseline: rule<TAB>path<TAB>code; one line per finding\n";
  for (const Finding& f : findings) {
    std::string code = f.code;
    std::replace(code.begin(), code.end(), '\t', ' ');
    out += f.rule->id + "\t" + f.path + "\t" + code + "\n";
  }
  return out;
}

Status ApplyBaseline(const std::string& baseline_path, ScanReport* report) {
  std::ifstream in(baseline_path);
  if (!in) return NotFound("{}: cannot read the baseline file", baseline_path);
  std::multiset<std::string> known;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const size_t t1 = line.find('\t');
    const size_t t2 = t1 == std::string::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string::npos) {
      return InvalidArgument("{}:{}: expected \"RULE<TAB>path<TAB>code\"", baseline_path, n);
    }
    known.insert(line);
  }
  std::vector<Finding> kept;
  for (Finding& f : report->findings) {
    std::string code = f.code;
    std::replace(code.begin(), code.end(), '\t', ' ');
    auto it = known.find(f.rule->id + "\t" + f.path + "\t" + code);
    if (it != known.end()) {
      known.erase(it);
      ++report->baselined;
    } else {
      kept.push_back(std::move(f));
    }
  }
  report->findings = std::move(kept);
  Summarize(report);
  return Status::Ok();
}

void Summarize(ScanReport* report) {
  const int t = static_cast<int>(report->target);
  std::sort(report->findings.begin(), report->findings.end(), [](const Finding& a, const Finding& b) {
    if (a.path != b.path) return a.path < b.path;
    if (a.line != b.line) return a.line < b.line;
    if (a.col != b.col) return a.col < b.col;
    return a.rule->id < b.rule->id;
  });
  report->by_rule.clear();
  report->by_category[0] = report->by_category[1] = report->by_category[2] = 0;
  struct Acc {
    std::map<std::string, int> hits_per_file;
    std::set<std::string> symbols;
  };
  std::map<std::string, Acc> acc;
  for (const Finding& f : report->findings) {
    Acc& a = acc[f.rule->id];
    ++a.hits_per_file[f.path];
    if (!f.unit.empty()) a.symbols.insert(f.unit);
    ++report->by_category[static_cast<int>(f.rule->category[t])];
  }
  double hours = 0, costly = 0;
  for (const auto& [id, a] : acc) {
    const Rule* rule = FindRule(id);
    RuleTotals rt;
    for (const auto& [file, hits] : a.hits_per_file) {
      rt.hits += hits;
      ++rt.files;
    }
    rt.symbols = static_cast<int>(a.symbols.size());
    switch (rule->count_mode) {
      case CountMode::kPerHit:
        for (const auto& [file, hits] : a.hits_per_file) {
          rt.units += std::min(hits, kMaxPricedHitsPerFile);
        }
        break;
      case CountMode::kPerSymbol: rt.units = std::max(1, rt.symbols); break;
      case CountMode::kPerFile: rt.units = rt.files; break;
      case CountMode::kOnce: rt.units = 1; break;
    }
    // Weights are set for the catalogue's reference target (ascend); on another target a rule
    // whose category is easier or harder there is scaled per category step.
    static constexpr double kStep[5] = {0.1, 0.4, 1.0, 2.5, 6.0};  // -2 .. +2 steps
    const int steps = static_cast<int>(rule->category[t]) - static_cast<int>(rule->category[0]);
    rt.hours = rt.units * HoursForWeight(rule->weight) * kStep[steps + 2];
    rt.points = static_cast<int>(rt.units * rule->weight + 0.5);
    hours += rt.hours;
    if (rule->category[t] == Category::kCostly) costly += rt.hours;
    report->by_rule[id] = rt;
  }
  report->hours = hours;
  report->hours_low = hours * 0.7;
  report->hours_high = hours * 1.5;
  report->costly_share = hours > 0 ? costly / hours : 0;
  if (report->findings.empty()) {
    report->bucket = "nothing to port";
  } else if (report->costly_share < 0.10) {
    report->bucket = "mostly mechanical";
  } else if (report->costly_share <= 0.40) {
    report->bucket = "moderate";
  } else {
    report->bucket = "kernel rewrite project";
  }
}

}  // namespace dh::scan
