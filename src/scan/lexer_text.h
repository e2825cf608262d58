// What the scan lexers share (src/scan/lexers.cc: build files and words; lexers_code.cc: Python
// and C/C++/CUDA): character classes, a line/column cursor, and the requirement atoms that
// setup.py strings and requirement files both produce. Internal to src/scan.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "scan/lexers.h"

namespace dh::scan::lex {

inline bool IsIdentStart(unsigned char c) { return std::isalpha(c) || c == '_' || c >= 0x80; }
inline bool IsIdentChar(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }
inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

inline std::string_view Basename(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

inline bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
inline bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

inline std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A cursor over the text that tracks line and column.
struct Cursor {
  std::string_view s;
  size_t i = 0;
  int line = 1;
  size_t line_start = 0;

  bool done() const { return i >= s.size(); }
  char peek(size_t k = 0) const { return i + k < s.size() ? s[i + k] : '\0'; }
  int col() const { return static_cast<int>(i - line_start) + 1; }
  void advance() {
    if (s[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
    ++i;
  }
  void advance(size_t n) {
    for (size_t k = 0; k < n && !done(); ++k) advance();
  }
  bool AtLineStartIgnoringBlanks() const {
    for (size_t k = line_start; k < i; ++k) {
      if (!IsSpace(s[k])) return false;
    }
    return true;
  }
};

// Adds the requirement atoms of one requirement-like string: the normalised project name and the
// whole spec (lower case), e.g. "Flash_Attn>=2.5" -> "flash-attn", "flash_attn>=2.5".
void AddRequirement(std::string_view spec, int line, int col, std::vector<Atom>* out);

// Python (setup_py: string literals are requirement candidates too) and C/C++ (cuda: .cu/.cuh).
void LexPython(std::string_view text, bool setup_py, LexResult* out);
void LexC(std::string_view text, bool cuda, LexResult* out);

}  // namespace dh::scan::lex
