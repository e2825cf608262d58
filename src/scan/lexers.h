// Lexers for `deepharness scan`: one per language family. Each turns a file into "atoms" (the
// things rules match: resolved Python names, string contents, C identifiers, build-file words,
// requirements, base images) and the comments (for inline suppressions). Comments never produce
// atoms; strings produce atoms only of the kinds where a string is the point (Python string
// contents, build-file words, requirements).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "scan/rules.h"

namespace dh::scan {

enum class FileClass {
  kPython,
  kSetupPy,       // Python whose string literals are also requirements
  kC,             // C / C++ sources and headers
  kCuda,          // .cu / .cuh
  kCMake,
  kShell,         // *.sh, Makefile, *.env, *.service, ini-like files
  kDockerfile,
  kYaml,
  kCondaEnv,      // environment*.yml: YAML whose list items are also requirements
  kRequirements,  // requirements*.txt, constraints*.txt
  kToml,          // pyproject.toml: string literals are requirements
  kJson,          // dashboards, alert rules
  kOther,         // not scanned
};

const char* FileClassName(FileClass c);

// Classifies by file name only (no content sniffing), e.g. "CMakeLists.txt" -> kCMake.
FileClass ClassifyPath(std::string_view path);

struct Atom {
  PatternKind kind;
  std::string text;
  int line = 1;    // 1-based
  int col = 1;     // 1-based byte column of the atom's start
  std::string symbol;  // optional: the symbol it counts as (e.g. the kernel name after __global__)
};

struct Comment {
  int line;
  bool own_line;  // nothing but blanks before it on its line
  std::string text;
};

struct LexResult {
  std::vector<Atom> atoms;
  std::vector<Comment> comments;
  int lines = 0;
};

LexResult Lex(FileClass cls, std::string_view text);

}  // namespace dh::scan
