// Text and argument helpers of the interpreter's builtins (see jinja_text.h).
#include "chat/jinja_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace dh::chat::jinja {

// Keyword `name`, else positional `index`, else `def`.
Value Arg(const CallArgs& a, size_t index, std::string_view name, Value def) {
  for (const auto& [k, v] : a.keyword) {
    if (k == name) return v;
  }
  if (index < a.positional.size()) return a.positional[index];
  return def;
}

int64_t AsInt(const Value& v, int64_t def) {
  if (v.is_int()) return v.int_value();
  if (v.is_bool()) return v.bool_value();
  if (v.is_float()) return static_cast<int64_t>(v.float_value());
  return def;
}

std::string AsciiLower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string AsciiUpper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool IsAlpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }

std::string Capitalize(std::string s) {
  s = AsciiLower(std::move(s));
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// Python str.title(): a letter after a non-letter starts a word.
std::string PyTitle(std::string s) {
  bool prev_cased = false;
  for (char& c : s) {
    if (IsAlpha(c)) {
      c = static_cast<char>(prev_cased ? std::tolower(static_cast<unsigned char>(c))
                                       : std::toupper(static_cast<unsigned char>(c)));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return s;
}

// Jinja's title filter: words begin after whitespace or an opening bracket/dash.
std::string JinjaTitle(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char c : s) {
    bool sep = kPyWhitespace.find(c) != std::string_view::npos || c == '-' || c == '(' ||
               c == '{' || c == '[' || c == '<';
    if (sep) {
      out += c;
      word_start = true;
    } else {
      out += static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                          : std::tolower(static_cast<unsigned char>(c)));
      word_start = false;
    }
  }
  return out;
}

std::string Strip(std::string_view s, std::string_view chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && chars.find(s[b]) != std::string_view::npos) ++b;
  }
  if (right) {
    while (e > b && chars.find(s[e - 1]) != std::string_view::npos) --e;
  }
  return std::string(s.substr(b, e - b));
}

int64_t CountCodePoints(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

Status FilterTypeError(std::string_view filter, const Value& v) {
  return InvalidArgument("Cannot apply filter \"{}\" to type: {}", filter, v.TypeName());
}

Result<std::string> Replace(const std::string& s, const std::string& from, const std::string& to,
                            int64_t count, size_t max_bytes) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    auto chars = SplitCodePoints(s);
    for (size_t i = 0; i <= chars.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < chars.size()) out += chars[i];
      if (out.size() > max_bytes)
        return ResourceExhausted("replace() result over {} bytes", max_bytes);
    }
    return out;
  }
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++done;
    if (out.size() > max_bytes)
      return ResourceExhausted("replace() result over {} bytes", max_bytes);
  }
  out.append(s, pos);
  return out;
}

ValueList Split(const std::string& s, const Value& sep, int64_t maxsplit) {
  ValueList out;
  if (sep.is_undefined() || sep.is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && kPyWhitespace.find(s[i]) != std::string_view::npos) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = Strip(std::string_view(s).substr(i), kPyWhitespace, false, true);
        out.push_back(Value::String(rest));
        break;
      }
      size_t j = i;
      while (j < s.size() && kPyWhitespace.find(s[j]) == std::string_view::npos) ++j;
      out.push_back(Value::String(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep.str();
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.push_back(Value::String(s.substr(pos, hit - pos)));
    pos = hit + d.size();
  }
  out.push_back(Value::String(s.substr(pos)));
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Escapes non-ASCII as \uXXXX (surrogate pairs above U+FFFF), for tojson(ensure_ascii=True).
std::string EnsureAscii(const std::string& json) {
  std::string out;
  for (std::string_view cp : SplitCodePoints(json)) {
    unsigned char c0 = static_cast<unsigned char>(cp[0]);
    if (c0 < 0x80 || cp.size() == 1) {
      out.append(cp);
      continue;
    }
    uint32_t v = cp.size() == 2 ? (c0 & 0x1F) : cp.size() == 3 ? (c0 & 0x0F) : (c0 & 0x07);
    for (size_t k = 1; k < cp.size(); ++k)
      v = (v << 6) | (static_cast<unsigned char>(cp[k]) & 0x3F);
    if (v >= 0x10000) {
      v -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", v);
    }
  }
  return out;
}

// Attribute lookup used by filters: "a.b" walks dicts, integer parts index lists.
Value AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_dict()) {
      const Value* next = cur.dict().Find(part);
      cur = next ? *next : Value::Undefined(part);
    } else if (cur.is_list() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      size_t i = std::stoul(part);
      cur = i < cur.list().size() ? cur.list()[i] : Value::Undefined(part);
    } else {
      return Value::Undefined(part);
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

}  // namespace dh::chat::jinja
