// Operators, globals, filters, tests and str/dict methods of the chat-template interpreter.
// Semantics follow Python/Jinja2 as Hugging Face renders templates; string filters refuse
// non-strings ("Cannot apply filter "trim" to type: NullValue") as @huggingface/jinja does.
#include <algorithm>
#include <cmath>
#include <ctime>

#include "chat/jinja_interpreter.h"

namespace dh::chat::jinja {
namespace {

constexpr std::string_view kPyWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";

// Keyword `name`, else positional `index`, else `def`.
Value Arg(const CallArgs& a, size_t index, std::string_view name, Value def = Value()) {
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
      if (out.size() > max_bytes) return ResourceExhausted("replace() result over {} bytes", max_bytes);
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
    if (out.size() > max_bytes) return ResourceExhausted("replace() result over {} bytes", max_bytes);
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
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
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
    for (size_t k = 1; k < cp.size(); ++k) v = (v << 6) | (static_cast<unsigned char>(cp[k]) & 0x3F);
    if (v >= 0x10000) {
      v -= 0x10000;
      out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
    } else {
      out += fmt::format("\\u{:04x}", v);
    }
  }
  return out;
}

}  // namespace

void Interpreter::InstallGlobals() {
  globals_["range"] = Value::Function("range", [this](CallArgs& a) -> Result<Value> {
    if (a.positional.empty() || a.positional.size() > 3) {
      return InvalidArgument("range() takes 1 to 3 integer arguments");
    }
    for (const Value& v : a.positional) {
      if (!v.is_int() && !v.is_bool()) return InvalidArgument("range() arguments must be integers");
    }
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = AsInt(a.positional[0], 0);
    } else {
      start = AsInt(a.positional[0], 0);
      stop = AsInt(a.positional[1], 0);
      if (a.positional.size() == 3) step = AsInt(a.positional[2], 1);
    }
    if (step == 0) return InvalidArgument("range() step must not be zero");
    long double span = step > 0 ? static_cast<long double>(stop) - start
                                : static_cast<long double>(start) - stop;
    long double count_f = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
    if (count_f > static_cast<long double>(limits_.max_range)) {
      return ResourceExhausted("range() of {} items is over the limit of {}",
                               static_cast<double>(count_f), limits_.max_range);
    }
    int64_t count = static_cast<int64_t>(count_f);
    DH_RETURN_IF_ERROR(Step(count));
    ValueList items;
    items.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) items.push_back(Value::Int(start + i * step));
    return Value::List(std::move(items));
  });
  auto make_dict = [](CallArgs& a, bool is_namespace) -> Result<Value> {
    Value d = Value::Dict();
    d.dict().is_namespace = is_namespace;
    for (const Value& p : a.positional) {
      if (!p.is_dict()) return InvalidArgument("expected keyword arguments or a dict");
      for (const auto& [k, v] : p.dict().items()) {
        DH_ASSIGN_OR_RETURN(Value c, DeepCopy(v));
        d.dict().Set(k, std::move(c));
      }
    }
    for (const auto& [k, v] : a.keyword) {
      DH_ASSIGN_OR_RETURN(Value c, DeepCopy(v));
      d.dict().Set(k, std::move(c));
    }
    return d;
  };
  globals_["namespace"] = Value::Function("namespace", [make_dict](CallArgs& a) {
    return make_dict(a, true);
  });
  globals_["dict"] = Value::Function("dict", [make_dict](CallArgs& a) { return make_dict(a, false); });
  globals_["raise_exception"] = Value::Function("raise_exception", [](CallArgs& a) -> Result<Value> {
    std::string msg = a.positional.empty() ? "raise_exception() called" : "";
    if (!a.positional.empty()) {
    DH_ASSIGN_OR_RETURN(msg, ToStr(a.positional[0]));
  }
    return InvalidArgument("{}", msg);
  });
  globals_["strftime_now"] = Value::Function("strftime_now", [](CallArgs& a) -> Result<Value> {
    if (a.positional.empty() || !a.positional[0].is_string()) {
      return InvalidArgument("strftime_now() takes a format string");
    }
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof(buf), a.positional[0].str().c_str(), &tm);
    return Value::String(std::string(buf, n));
  });
}

Result<Value> Interpreter::Arith(const std::string& op, const Value& a, const Value& b) {
  auto type_error = [&]() {
    return InvalidArgument("unsupported operand types for {}: {} and {}", op, a.TypeName(),
                           b.TypeName());
  };
  if (op == "~") {
    DH_ASSIGN_OR_RETURN(std::string x, ToStr(a));
    DH_ASSIGN_OR_RETURN(std::string y, ToStr(b));
    DH_RETURN_IF_ERROR(CheckSize(x.size() + y.size()));
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>((x.size() + y.size()) >> 10)));
    return Value::String(x + y);
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    DH_RETURN_IF_ERROR(CheckSize(a.str().size() + b.str().size()));
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>((a.str().size() + b.str().size()) >> 10)));
    return Value::String(a.str() + b.str());
  }
  if (op == "+" && a.is_list() && b.is_list()) {
    ValueList items = a.list();
    items.insert(items.end(), b.list().begin(), b.list().end());
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size())));
    return Value::List(std::move(items));
  }
  if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
    const Value& seq = (a.is_string() || a.is_list()) ? a : b;
    const Value& times = (a.is_string() || a.is_list()) ? b : a;
    if (!times.is_int() && !times.is_bool()) return type_error();
    int64_t n = std::max<int64_t>(AsInt(times, 0), 0);
    size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
    uint64_t total = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(unit), static_cast<uint64_t>(n), &total) ||
        total > limits_.max_string_bytes) {
      return ResourceExhausted("repetition of {} x {} is over the limit of {}", unit, n,
                               limits_.max_string_bytes);
    }
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(seq.is_string() ? total >> 10 : total)));
    if (seq.is_string()) {
      std::string out;
      out.reserve(total);
      for (int64_t i = 0; i < n; ++i) out += seq.str();
      return Value::String(std::move(out));
    }
    ValueList items;
    for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.list().begin(), seq.list().end());
    return Value::List(std::move(items));
  }
  if (op == "%" && a.is_string()) {
    return InvalidArgument("printf-style '%' string formatting is not supported");
  }
  if (!a.is_number() || !b.is_number()) return type_error();
  if (a.is_float() || b.is_float() || op == "/") {
    double x = a.AsDouble(), y = b.AsDouble();
    if (op == "+") return Value::Float(x + y);
    if (op == "-") return Value::Float(x - y);
    if (op == "*") return Value::Float(x * y);
    if (op == "**") return Value::Float(std::pow(x, y));
    if (y == 0) return InvalidArgument("division by zero");
    if (op == "/") return Value::Float(x / y);
    if (op == "//") return Value::Float(std::floor(x / y));
    if (op == "%") {
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    return type_error();
  }
  int64_t x = AsInt(a, 0), y = AsInt(b, 0), r = 0;
  auto overflow = [] { return InvalidArgument("integer overflow"); };
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) return overflow();
    return Value::Int(r);
  }
  if (op == "**") {
    if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
    int64_t result = 1, base = x;
    for (int64_t e = y; e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(result, base, &result)) return overflow();
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) return overflow();
    }
    return Value::Int(result);
  }
  if (y == 0) return InvalidArgument("division by zero");
  if (x == INT64_MIN && y == -1) return overflow();
  if (op == "//") {
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::Int(q);
  }
  if (op == "%") {
    int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::Int(m);
  }
  return type_error();
}

Result<bool> Interpreter::Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument("'in <string>' requires a string, not {}", item.TypeName());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(container.list().size())));
      for (const Value& v : container.list()) {
        if (ValuesEqual(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict: return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default: return InvalidArgument("argument of type {} is not iterable", container.TypeName());
  }
}

// Attribute lookup used by filters: "a.b" walks dicts, integer parts index lists.
static Value AttrPath(const Value& v, const std::string& path) {
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

Result<Value> Interpreter::CallFilter(const std::string& name, const Value& v, CallArgs& args,
                                      const ScopePtr& scope) {
  DH_RETURN_IF_ERROR(Step());
  auto need_string = [&]() -> Status {
    return v.is_string() ? Status::Ok() : FilterTypeError(name, v);
  };
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::Int(CountCodePoints(v.str()));
    if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.is_dict()) return Value::Int(static_cast<int64_t>(v.dict().size()));
    if (v.is_undefined()) return Value::Int(0);
    return FilterTypeError(name, v);
  }
  if (name == "tojson") {
    // Hugging Face: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
    JsonOptions o;
    Value ensure_ascii = Arg(args, 0, "ensure_ascii", Value::Bool(false));
    Value indent = Arg(args, 1, "indent");
    Value separators = Arg(args, 2, "separators");
    o.sort_keys = Arg(args, 3, "sort_keys", Value::Bool(false)).Truthy();
    if (indent.is_int()) o.indent = static_cast<int>(std::clamp<int64_t>(indent.int_value(), 0, 64));
    if (separators.is_list() && separators.list().size() == 2 && separators.list()[0].is_string() &&
        separators.list()[1].is_string()) {
      o.item_separator = separators.list()[0].str();
      o.key_separator = separators.list()[1].str();
    }
    DH_ASSIGN_OR_RETURN(std::string json, ToJson(v, o));
    if (ensure_ascii.Truthy()) json = EnsureAscii(json);
    DH_RETURN_IF_ERROR(CheckSize(json.size()));
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(json.size() >> 10)));
    return Value::String(std::move(json));
  }
  if (name == "trim") {
    DH_RETURN_IF_ERROR(need_string());
    Value chars = Arg(args, 0, "chars");
    return Value::String(Strip(v.str(), chars.is_string() ? chars.str() : kPyWhitespace, true, true));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    DH_RETURN_IF_ERROR(need_string());
    if (name == "upper") return Value::String(AsciiUpper(v.str()));
    if (name == "lower") return Value::String(AsciiLower(v.str()));
    if (name == "title") return Value::String(JinjaTitle(v.str()));
    return Value::String(Capitalize(v.str()));
  }
  if (name == "default" || name == "d") {
    Value def = Arg(args, 0, "default_value", Value::String(""));
    bool boolean = Arg(args, 1, "boolean", Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return def;
    return v;
  }
  if (name == "join") {
    Value sep = Arg(args, 0, "d", Value::String(""));
    Value attribute = Arg(args, 1, "attribute");
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    DH_ASSIGN_OR_RETURN(std::string sep_str, ToStr(sep));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      Value item = attribute.is_undefined() ? items[i] : AttrPath(items[i], ToStr(attribute).value());
      DH_ASSIGN_OR_RETURN(std::string s, ToStr(item));
      if (i) out += sep_str;
      out += s;
      DH_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size() + (out.size() >> 10))));
    return Value::String(std::move(out));
  }
  if (name == "first" || name == "last") {
    if (v.is_string()) {
      auto chars = SplitCodePoints(v.str());
      if (chars.empty()) return Value::Undefined(name);
      return Value::String(std::string(name == "first" ? chars.front() : chars.back()));
    }
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    if (items.empty()) return Value::Undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::List();
    if (!v.is_dict()) return FilterTypeError(name, v);
    ValueList pairs;
    for (const auto& [k, e] : v.dict().items()) pairs.push_back(Value::List({Value::String(k), e}));
    return Value::List(std::move(pairs));
  }
  if (name == "replace") {
    DH_RETURN_IF_ERROR(need_string());
    Value from = Arg(args, 0, "old"), to = Arg(args, 1, "new");
    if (!from.is_string() || !to.is_string()) return InvalidArgument("replace() needs two strings");
    int64_t count = AsInt(Arg(args, 2, "count", Value::Int(-1)), -1);
    DH_ASSIGN_OR_RETURN(std::string out, Replace(v.str(), from.str(), to.str(), count,
                                                 limits_.max_string_bytes));
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(out.size() >> 10)));
    return Value::String(std::move(out));
  }
  if (name == "string") {
    DH_ASSIGN_OR_RETURN(std::string s, ToStr(v));
    return Value::String(std::move(s));
  }
  if (name == "int" || name == "float") {
    bool to_int = name == "int";
    Value def = Arg(args, 0, "default", to_int ? Value::Int(0) : Value::Float(0.0));
    if (v.is_number()) {
      return to_int ? Value::Int(static_cast<int64_t>(v.AsDouble())) : Value::Float(v.AsDouble());
    }
    if (!v.is_string()) return def;
    std::string s = Strip(v.str(), kPyWhitespace, true, true);
    if (s.empty()) return def;
    char* end = nullptr;
    errno = 0;
    if (to_int) {
      long long x = std::strtoll(s.c_str(), &end, 10);
      if (*end != '\0' || errno == ERANGE) {
        double d = std::strtod(s.c_str(), &end);
        if (*end != '\0' || !std::isfinite(d) || std::fabs(d) > 9.2e18) return def;
        return Value::Int(static_cast<int64_t>(d));
      }
      return Value::Int(x);
    }
    double d = std::strtod(s.c_str(), &end);
    if (*end != '\0') return def;
    return Value::Float(d);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "selectattr" || name == "select";
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    size_t test_pos = by_attr ? 1 : 0;
    std::string attr;
    if (by_attr) {
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return InvalidArgument("{} needs an attribute name", name);
      }
      attr = args.positional[0].str();
    }
    ValueList out;
    for (const Value& item : items) {
      DH_RETURN_IF_ERROR(Step());
      Value probe = by_attr ? AttrPath(item, attr) : item;
      bool pass;
      if (args.positional.size() > test_pos) {
        if (!args.positional[test_pos].is_string()) return InvalidArgument("{}: test name must be a string", name);
        CallArgs test_args;
        test_args.positional.assign(args.positional.begin() + static_cast<long>(test_pos) + 1,
                                    args.positional.end());
        DH_ASSIGN_OR_RETURN(pass, CallTest(args.positional[test_pos].str(), probe, test_args));
      } else {
        pass = probe.Truthy();
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value::List(std::move(out));
  }
  if (name == "map") {
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    Value attribute = Arg(args, 99, "attribute");
    ValueList out;
    if (attribute.is_string()) {
      Value def = Arg(args, 99, "default");
      for (const Value& item : items) {
        Value got = AttrPath(item, attribute.str());
        out.push_back(got.is_undefined() && !def.is_undefined() ? def : got);
      }
      DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size())));
      return Value::List(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return InvalidArgument("map needs a filter name or attribute=");
    }
    std::string filter = args.positional[0].str();
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : items) {
      CallArgs copy = rest;
      DH_ASSIGN_OR_RETURN(Value mapped, CallFilter(filter, item, copy, scope));
      out.push_back(std::move(mapped));
    }
    return Value::List(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto chars = SplitCodePoints(v.str());
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(*it);
      return Value::String(std::move(out));
    }
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "dictsort") {
    bool case_sensitive = Arg(args, name == "sort" ? 1 : 0, "case_sensitive", Value::Bool(false)).Truthy();
    bool reverse = name == "sort" ? Arg(args, 0, "reverse", Value::Bool(false)).Truthy()
                 : name == "dictsort" ? Arg(args, 2, "reverse", Value::Bool(false)).Truthy()
                                      : false;
    Value attribute = Arg(args, name == "sort" ? 2 : 1, "attribute");
    ValueList items;
    bool by_value = false;
    if (name == "dictsort") {
      if (!v.is_dict()) return FilterTypeError(name, v);
      for (const auto& [k, e] : v.dict().items()) items.push_back(Value::List({Value::String(k), e}));
      by_value = Arg(args, 1, "by", Value::String("key")).is_string() &&
                 Arg(args, 1, "by", Value::String("key")).str() == "value";
    } else {
      DH_ASSIGN_OR_RETURN(items, Iterate(v));
    }
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size()) * 8));
    auto key_of = [&](const Value& item) {
      Value k = name == "dictsort" ? item.list()[by_value ? 1 : 0]
                : attribute.is_string() ? AttrPath(item, attribute.str())
                                        : item;
      if (!case_sensitive && k.is_string()) return Value::String(AsciiLower(k.str()));
      return k;
    };
    if (name == "unique") {
      ValueList out, seen;
      for (const Value& item : items) {
        Value k = key_of(item);
        bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return ValuesEqual(s, k); });
        if (!dup) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return Value::List(std::move(out));
    }
    Status error;
    auto less = [&](const Value& x, const Value& y) {
      auto r = ValueLess(key_of(x), key_of(y));
      if (!r.ok()) {
        if (error.ok()) error = r.status();
        return false;
      }
      return *r;
    };
    if (name == "min" || name == "max") {
      if (items.empty()) return Value::Undefined(name);
      auto it = name == "min" ? std::min_element(items.begin(), items.end(), less)
                              : std::max_element(items.begin(), items.end(), less);
      DH_RETURN_IF_ERROR(error);
      return *it;
    }
    std::stable_sort(items.begin(), items.end(), less);
    DH_RETURN_IF_ERROR(error);
    if (reverse) std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "sum") {
    Value attribute = Arg(args, 0, "attribute");
    Value total = Arg(args, 1, "start", Value::Int(0));
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(v));
    for (const Value& item : items) {
      DH_ASSIGN_OR_RETURN(total, Arith("+", total, attribute.is_string() ? AttrPath(item, attribute.str()) : item));
    }
    return total;
  }
  if (name == "abs") {
    if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
    if (v.is_int() || v.is_bool()) {
      int64_t x = AsInt(v, 0);
      if (x == INT64_MIN) return InvalidArgument("integer overflow");
      return Value::Int(x < 0 ? -x : x);
    }
    return FilterTypeError(name, v);
  }
  if (name == "round") {
    if (!v.is_number()) return FilterTypeError(name, v);
    int64_t precision = AsInt(Arg(args, 0, "precision", Value::Int(0)), 0);
    Value method = Arg(args, 1, "method", Value::String("common"));
    double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
    double x = v.AsDouble() * scale;
    std::string m = method.is_string() ? method.str() : "common";
    // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
    x = m == "ceil" ? std::ceil(x) : m == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value::Float(x / scale);
  }
  if (name == "safe") return v;
  if (name == "escape" || name == "e") {
    DH_ASSIGN_OR_RETURN(std::string s, ToStr(v));
    return Value::String(HtmlEscape(s));
  }
  if (name == "indent") {
    DH_RETURN_IF_ERROR(need_string());
    Value width = Arg(args, 0, "width", Value::Int(4));
    bool first = Arg(args, 1, "first", Value::Bool(false)).Truthy();
    bool blank = Arg(args, 2, "blank", Value::Bool(false)).Truthy();
    std::string pad = width.is_string() ? width.str()
                                        : std::string(static_cast<size_t>(std::clamp<int64_t>(AsInt(width, 4), 0, 256)), ' ');
    std::string out;
    size_t pos = 0;
    bool first_line = true;
    const std::string& s = v.str();
    while (pos <= s.size()) {
      size_t nl = s.find('\n', pos);
      std::string line = s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      if ((first_line ? first : true) && (blank || !line.empty())) out += pad;
      out += line;
      DH_RETURN_IF_ERROR(CheckSize(out.size()));
      if (nl == std::string::npos) break;
      out += '\n';
      pos = nl + 1;
      first_line = false;
    }
    return Value::String(std::move(out));
  }
  if (name == "attr") {
    Value attr = Arg(args, 0, "name");
    if (!attr.is_string()) return InvalidArgument("attr() needs a name");
    if (v.is_dict()) {
      const Value* got = v.dict().Find(attr.str());
      return got ? *got : Value::Undefined(attr.str());
    }
    return Value::Undefined(attr.str());
  }
  return InvalidArgument("unknown filter '{}'", name);
}

Result<bool> Interpreter::CallTest(const std::string& name, const Value& v, CallArgs& args) {
  DH_RETURN_IF_ERROR(Step());
  Value other = Arg(args, 0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.bool_value();
  if (name == "false") return v.is_bool() && !v.bool_value();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.is_callable();
  if (name == "equalto" || name == "eq" || name == "==") return ValuesEqual(v, other);
  if (name == "ne" || name == "!=") return !ValuesEqual(v, other);
  if (name == "sameas") {
    if (v.identity() || other.identity()) return v.identity() == other.identity();
    return v.kind() == other.kind() && ValuesEqual(v, other);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return ValueLess(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return ValueLess(other, v);
  if (name == "le" || name == "<=") {
    DH_ASSIGN_OR_RETURN(bool gt, ValueLess(other, v));
    return !gt;
  }
  if (name == "ge" || name == ">=") {
    DH_ASSIGN_OR_RETURN(bool lt, ValueLess(v, other));
    return !lt;
  }
  if (name == "in") return Contains(other, v);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int() && !v.is_bool()) return InvalidArgument("test '{}' needs an integer", name);
    int64_t x = AsInt(v, 0);
    if (name == "odd") return x % 2 != 0;
    if (name == "even") return x % 2 == 0;
    int64_t d = AsInt(Arg(args, 0, "num"), 0);
    if (d == 0) return InvalidArgument("divisibleby 0");
    return x % d == 0;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return v.str() == (name == "lower" ? AsciiLower(v.str()) : AsciiUpper(v.str()));
  }
  return InvalidArgument("unknown test '{}'", name);
}

bool Interpreter::HasMethod(const Value& obj, const std::string& name) const {
  static const char* kStringMethods[] = {
      "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace",
      "upper", "lower", "title", "capitalize", "find", "rfind", "count", "join", "isdigit",
      "isalpha", "isalnum", "isspace", "islower", "isupper"};
  static const char* kDictMethods[] = {"items", "keys", "values", "get"};
  if (obj.is_string()) {
    return std::any_of(std::begin(kStringMethods), std::end(kStringMethods),
                       [&](const char* m) { return name == m; });
  }
  if (obj.is_dict() && !obj.dict().is_namespace) {
    return std::any_of(std::begin(kDictMethods), std::end(kDictMethods),
                       [&](const char* m) { return name == m; });
  }
  return false;
}

Result<Value> Interpreter::CallMethod(const Value& obj, const std::string& name, CallArgs& args) {
  DH_RETURN_IF_ERROR(Step());
  if (obj.is_dict()) {
    const ValueDict& d = obj.dict();
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(d.size())));
    if (name == "get") {
      Value key = Arg(args, 0, "key");
      const Value* got = key.is_string() ? d.Find(key.str()) : nullptr;
      return got ? *got : Arg(args, 1, "default", Value::None());
    }
    ValueList out;
    for (const auto& [k, v] : d.items()) {
      if (name == "items") out.push_back(Value::List({Value::String(k), v}));
      else if (name == "keys") out.push_back(Value::String(k));
      else out.push_back(v);
    }
    return Value::List(std::move(out));
  }
  const std::string& s = obj.str();
  DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(s.size() >> 10)));
  if (name == "startswith" || name == "endswith") {
    Value arg = Arg(args, 0, "prefix");
    ValueList candidates = arg.is_list() ? arg.list() : ValueList{arg};
    for (const Value& c : candidates) {
      if (!c.is_string()) return InvalidArgument("{}() needs a string, got {}", name, c.TypeName());
      const std::string& p = c.str();
      bool hit = name == "startswith" ? s.rfind(p, 0) == 0
                                      : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Value chars = Arg(args, 0, "chars");
    std::string_view set = chars.is_string() ? std::string_view(chars.str()) : kPyWhitespace;
    return Value::String(Strip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Value sep = Arg(args, 0, "sep");
    if (!sep.is_undefined() && !sep.is_none() && (!sep.is_string() || sep.str().empty())) {
      return InvalidArgument("split() separator must be a non-empty string");
    }
    int64_t maxsplit = AsInt(Arg(args, 1, "maxsplit", Value::Int(-1)), -1);
    if (name == "rsplit" && maxsplit >= 0) {
      return InvalidArgument("rsplit() with maxsplit is not supported");
    }
    ValueList parts = Split(s, sep, maxsplit);
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(parts.size())));
    return Value::List(std::move(parts));
  }
  if (name == "replace") {
    Value from = Arg(args, 0, "old"), to = Arg(args, 1, "new");
    if (!from.is_string() || !to.is_string()) return InvalidArgument("replace() needs two strings");
    int64_t count = AsInt(Arg(args, 2, "count", Value::Int(-1)), -1);
    DH_ASSIGN_OR_RETURN(std::string out, Replace(s, from.str(), to.str(), count, limits_.max_string_bytes));
    return Value::String(std::move(out));
  }
  if (name == "upper") return Value::String(AsciiUpper(s));
  if (name == "lower") return Value::String(AsciiLower(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(Capitalize(s));
  if (name == "find" || name == "rfind" || name == "count") {
    Value sub = Arg(args, 0, "sub");
    if (!sub.is_string()) return InvalidArgument("{}() needs a string", name);
    const std::string& p = sub.str();
    if (name == "count") {
      if (p.empty()) return Value::Int(CountCodePoints(s) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(p); pos != std::string::npos; pos = s.find(p, pos + p.size())) ++n;
      return Value::Int(n);
    }
    size_t pos = name == "find" ? s.find(p) : s.rfind(p);
    if (pos == std::string::npos) return Value::Int(-1);
    return Value::Int(CountCodePoints(std::string_view(s).substr(0, pos)));
  }
  if (name == "join") {
    DH_ASSIGN_OR_RETURN(ValueList items, Iterate(Arg(args, 0, "iterable")));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) return InvalidArgument("join() items must be strings, got {}", items[i].TypeName());
      if (i) out += s;
      out += items[i].str();
      DH_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  auto all = [&](auto pred) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); });
  };
  if (name == "isdigit") return Value::Bool(all(::isdigit));
  if (name == "isalpha") return Value::Bool(all(::isalpha));
  if (name == "isalnum") return Value::Bool(all(::isalnum));
  if (name == "isspace") return Value::Bool(all(::isspace));
  if (name == "islower") return Value::Bool(std::any_of(s.begin(), s.end(), ::islower) && s == AsciiLower(s));
  if (name == "isupper") return Value::Bool(std::any_of(s.begin(), s.end(), ::isupper) && s == AsciiUpper(s));
  return InvalidArgument("str has no method '{}'", name);
}

}  // namespace dh::chat::jinja
