// The CUDA lock-in rule catalogue of `deepharness scan` (docs/migration.md, "Rules"). One table
// holds every rule: its patterns for each language family, its category and replacement on each
// target backend, its severity, effort weight and how its hits are counted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/glob.h"

namespace dh::scan {

enum class Target { kAscend = 0, kRocm = 1, kCpu = 2 };
inline constexpr int kNumTargets = 3;

// How hard the port is on a target: a rename (direct), an equivalent with different semantics or
// coverage (partial), or no equivalent (costly).
enum class Category { kDirect = 0, kPartial = 1, kCostly = 2 };

// Whether the code fails on a non-CUDA host (error) or only runs slower / differently (warning).
enum class Severity { kWarning = 0, kError = 1 };

// per-hit: every occurrence costs the weight (at most kMaxPricedHitsPerFile per file);
// per-symbol: each distinct symbol costs it once; per-file: each file once; once: once per tree.
enum class CountMode { kPerHit, kPerSymbol, kPerFile, kOnce };
inline constexpr int kMaxPricedHitsPerFile = 10;

// Where a pattern applies (the atoms the lexers emit, see lexers.h).
enum class PatternKind {
  kPyName,    // "py:"   import-resolved dotted Python name (or an imported module)
  kPyIdent,   // "id:"   any Python identifier (keyword arguments, distinctive class names)
  kPyCall,    // "call:" a method called on any receiver: x.NAME(...)
  kPyString,  // "str:"  a Python string literal's content (a string without blanks)
  kPyCommand, // "cmd:"  the first word of a Python string (a command line, "nvidia-smi -L")
  kC,         // "c:"    a C/C++/CUDA identifier or a::b chain (or the <<< launch token)
  kCuda,      // "cu:"   as kC but only in .cu/.cuh files
  kInclude,   // "inc:"  a C/C++ header name
  kWord,      // "w:"    a word of a build, shell, Dockerfile, YAML, JSON or ini file
  kReq,       // "req:"  a Python requirement (normalised name, or the whole spec)
  kFrom,      // "from:" a Dockerfile base image
};

struct Pattern {
  PatternKind kind;
  std::string glob;  // '*' any run of characters, '#' one or more digits, the rest literal
  int specificity;   // number of literal characters: the most specific matching rule wins
};

struct Rule {
  std::string id;
  std::string title;
  std::string family;  // "python", "c++", "build", "container", "deploy"
  Severity severity;
  CountMode count_mode;
  int weight;  // effort points (1 ~ 10 min ... 20 ~ 2+ weeks)
  Category category[kNumTargets];
  std::string replacement[kNumTargets];
  std::vector<Pattern> patterns;
};

const std::vector<Rule>& Rules();

// nullptr when no rule has that id.
const Rule* FindRule(std::string_view id);


const char* TargetName(Target t);
bool ParseTarget(std::string_view s, Target* t);
const char* CategoryName(Category c);
const char* SeverityName(Severity s);
const char* CountModeName(CountMode m);

// Hours of work one unit of a rule with this weight costs (the Fibonacci-like point scale).
double HoursForWeight(int weight);

}  // namespace dh::scan
