// Shell-style name patterns for filters (--dump-filter): '*' matches any run of characters,
// '?' one character; a comma separates alternatives. No character classes, no escapes.
#pragma once

#include <string_view>

namespace dh {

// True when `text` matches the whole of one of the comma-separated patterns of `patterns`.
bool GlobMatch(std::string_view patterns, std::string_view text);

}  // namespace dh
