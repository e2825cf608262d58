// Shell-style name patterns, shared by `scan` (rule patterns, path and rule-id filters) and
// tensor dumps (--dump-filter): '*' matches any run of characters, '?' one character, '#' one or
// more digits (greedy: a digit never follows '#' in a pattern). No character classes, no escapes.
#pragma once

#include <string_view>

namespace dh {

// True when `text` matches the whole of `pattern`.
bool GlobMatch(std::string_view pattern, std::string_view text);

// True when `text` matches the whole of one of the comma-separated patterns of `patterns`.
bool GlobMatchAny(std::string_view patterns, std::string_view text);

}  // namespace dh
