// GlobMatch (glob.h): iterative matching with one backtrack point per '*', linear in practice.
#include "base/glob.h"

namespace dh {
namespace {

bool MatchOne(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0;
  size_t star = std::string_view::npos, star_t = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi;
      ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      star_t = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++star_t;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace

bool GlobMatch(std::string_view patterns, std::string_view text) {
  size_t start = 0;
  while (start <= patterns.size()) {
    size_t end = patterns.find(',', start);
    if (end == std::string_view::npos) end = patterns.size();
    if (MatchOne(patterns.substr(start, end - start), text)) return true;
    start = end + 1;
  }
  return false;
}

}  // namespace dh
