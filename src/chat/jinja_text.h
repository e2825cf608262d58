// Text and argument helpers shared by the interpreter's builtins: Python-style str operations
// (ASCII case mapping and whitespace), keyword/positional argument lookup.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "chat/jinja_value.h"

namespace dh::chat::jinja {

// Python's str.strip() whitespace (ASCII part).
inline constexpr std::string_view kPyWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";

// Keyword `name`, else positional `index`, else `def`.
Value Arg(const CallArgs& a, size_t index, std::string_view name, Value def = Value());
// Integer value of a bool/int/float, else `def`.
int64_t AsInt(const Value& v, int64_t def);

std::string AsciiLower(std::string s);
std::string AsciiUpper(std::string s);
std::string Capitalize(std::string s);
// Python str.title(): a letter after a non-letter starts a word.
std::string PyTitle(std::string s);
// Jinja's title filter: words begin after whitespace or an opening bracket/dash.
std::string JinjaTitle(const std::string& s);
std::string Strip(std::string_view s, std::string_view chars, bool left, bool right);
int64_t CountCodePoints(std::string_view s);
// "Cannot apply filter "trim" to type: NullValue" (the wording of @huggingface/jinja).
Status FilterTypeError(std::string_view filter, const Value& v);
// Python str.replace (count < 0: all); fails when the result would pass max_bytes.
Result<std::string> Replace(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count, size_t max_bytes);
// Python str.split: `sep` undefined/none splits on whitespace runs.
ValueList Split(const std::string& s, const Value& sep, int64_t maxsplit);
std::string HtmlEscape(const std::string& s);
// Escapes non-ASCII as \uXXXX (surrogate pairs above U+FFFF), for tojson(ensure_ascii=True).
std::string EnsureAscii(const std::string& json);
// Attribute lookup used by filters: "a.b" walks dicts, integer parts index lists.
Value AttrPath(const Value& v, const std::string& path);

}  // namespace dh::chat::jinja
