// Operators, globals, tests and str/dict methods of the chat-template interpreter, with Python
// semantics (floor division, modulo sign, overflow-checked integers).
#include <algorithm>
#include <cmath>
#include <ctime>

#include "chat/jinja_interpreter.h"
#include "chat/jinja_text.h"

namespace dh::chat::jinja {

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
    long double span =
        step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
    long double count_f =
        span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
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
  globals_["namespace"] =
      Value::Function("namespace", [make_dict](CallArgs& a) { return make_dict(a, true); });
  globals_["dict"] =
      Value::Function("dict", [make_dict](CallArgs& a) { return make_dict(a, false); });
  globals_["raise_exception"] =
      Value::Function("raise_exception", [](CallArgs& a) -> Result<Value> {
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
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument("'in <string>' requires a string, not {}", item.TypeName());
      }
      DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(container.str().size() >> 10)));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(container.list().size())));
      for (const Value& v : container.list()) {
        if (ValuesEqual(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default:
      return InvalidArgument("argument of type {} is not iterable", container.TypeName());
  }
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
      "startswith", "endswith", "strip",   "lstrip",     "rstrip",  "split",  "rsplit", "replace",
      "upper",      "lower",    "title",   "capitalize", "find",    "rfind",  "count",  "join",
      "isdigit",    "isalpha",  "isalnum", "isspace",    "islower", "isupper"};
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
      if (name == "items")
        out.push_back(Value::List({Value::String(k), v}));
      else if (name == "keys")
        out.push_back(Value::String(k));
      else
        out.push_back(v);
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
      bool hit = name == "startswith"
                     ? s.rfind(p, 0) == 0
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
    DH_ASSIGN_OR_RETURN(std::string out,
                        Replace(s, from.str(), to.str(), count, limits_.max_string_bytes));
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
      if (!items[i].is_string())
        return InvalidArgument("join() items must be strings, got {}", items[i].TypeName());
      if (i) out += s;
      out += items[i].str();
      DH_RETURN_IF_ERROR(CheckSize(out.size()));
    }
    return Value::String(std::move(out));
  }
  auto all = [&](auto pred) {
    return !s.empty() && std::all_of(s.begin(), s.end(),
                                     [&](char c) { return pred(static_cast<unsigned char>(c)); });
  };
  if (name == "isdigit") return Value::Bool(all(::isdigit));
  if (name == "isalpha") return Value::Bool(all(::isalpha));
  if (name == "isalnum") return Value::Bool(all(::isalnum));
  if (name == "isspace") return Value::Bool(all(::isspace));
  if (name == "islower")
    return Value::Bool(std::any_of(s.begin(), s.end(), ::islower) && s == AsciiLower(s));
  if (name == "isupper")
    return Value::Bool(std::any_of(s.begin(), s.end(), ::isupper) && s == AsciiUpper(s));
  return InvalidArgument("str has no method '{}'", name);
}

}  // namespace dh::chat::jinja
