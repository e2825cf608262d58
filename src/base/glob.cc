// GlobMatch (glob.h): iterative matching with one backtrack point for the last '*' seen, linear
// in practice.
#include "base/glob.h"

namespace dh {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

bool GlobMatch(std::string_view g, std::string_view t) {
  size_t gi = 0, ti = 0, star_g = std::string_view::npos, star_t = 0;
  while (ti < t.size() || gi < g.size()) {
    if (gi < g.size()) {
      const char c = g[gi];
      if (c == '*') {
        star_g = gi++;
        star_t = ti;
        continue;
      }
      if (c == '#') {
        if (ti < t.size() && IsDigit(t[ti])) {
          while (ti < t.size() && IsDigit(t[ti])) ++ti;
          ++gi;
          continue;
        }
      } else if (ti < t.size() && (c == '?' || t[ti] == c)) {
        ++gi;
        ++ti;
        continue;
      }
    }
    if (star_g != std::string_view::npos && star_t < t.size()) {
      gi = star_g + 1;
      ti = ++star_t;
      continue;
    }
    return false;
  }
  return true;
}

bool GlobMatchAny(std::string_view patterns, std::string_view text) {
  size_t start = 0;
  while (start <= patterns.size()) {
    size_t end = patterns.find(',', start);
    if (end == std::string_view::npos) end = patterns.size();
    if (GlobMatch(patterns.substr(start, end - start), text)) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace dh
