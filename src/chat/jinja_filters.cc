// Filters of the chat-template interpreter (`value | name(args)`), with Jinja2's argument names
// and Hugging Face's tojson; string filters refuse non-strings as @huggingface/jinja does.
#include <algorithm>
#include <cmath>

#include "chat/jinja_interpreter.h"
#include "chat/jinja_text.h"

namespace dh::chat::jinja {

Result<Value> Interpreter::CallFilter(const std::string& name, const Value& v, CallArgs& args,
                                      const ScopePtr& scope) {
  DH_RETURN_IF_ERROR(Step());
  // Filters scan their input: charge long strings and lists in proportion to their size.
  if (v.is_string()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v.str().size() >> 10)));
  if (v.is_list()) DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(v.list().size() >> 4)));
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
    if (indent.is_int())
      o.indent = static_cast<int>(std::clamp<int64_t>(indent.int_value(), 0, 64));
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
    return Value::String(
        Strip(v.str(), chars.is_string() ? chars.str() : kPyWhitespace, true, true));
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
      Value item =
          attribute.is_undefined() ? items[i] : AttrPath(items[i], ToStr(attribute).value());
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
    DH_ASSIGN_OR_RETURN(std::string out,
                        Replace(v.str(), from.str(), to.str(), count, limits_.max_string_bytes));
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
        if (!args.positional[test_pos].is_string())
          return InvalidArgument("{}: test name must be a string", name);
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
    bool case_sensitive =
        Arg(args, name == "sort" ? 1 : 0, "case_sensitive", Value::Bool(false)).Truthy();
    bool reverse = name == "sort"       ? Arg(args, 0, "reverse", Value::Bool(false)).Truthy()
                   : name == "dictsort" ? Arg(args, 2, "reverse", Value::Bool(false)).Truthy()
                                        : false;
    Value attribute = Arg(args, name == "sort" ? 2 : 1, "attribute");
    ValueList items;
    bool by_value = false;
    if (name == "dictsort") {
      if (!v.is_dict()) return FilterTypeError(name, v);
      for (const auto& [k, e] : v.dict().items())
        items.push_back(Value::List({Value::String(k), e}));
      by_value = Arg(args, 1, "by", Value::String("key")).is_string() &&
                 Arg(args, 1, "by", Value::String("key")).str() == "value";
    } else {
      DH_ASSIGN_OR_RETURN(items, Iterate(v));
    }
    DH_RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size()) * 8));
    auto key_of = [&](const Value& item) {
      Value k = name == "dictsort"      ? item.list()[by_value ? 1 : 0]
                : attribute.is_string() ? AttrPath(item, attribute.str())
                                        : item;
      if (!case_sensitive && k.is_string()) return Value::String(AsciiLower(k.str()));
      return k;
    };
    if (name == "unique") {
      ValueList out, seen;
      for (const Value& item : items) {
        Value k = key_of(item);
        bool dup = std::any_of(seen.begin(), seen.end(),
                               [&](const Value& s) { return ValuesEqual(s, k); });
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
      DH_ASSIGN_OR_RETURN(
          total, Arith("+", total, attribute.is_string() ? AttrPath(item, attribute.str()) : item));
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
    std::string pad =
        width.is_string()
            ? width.str()
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

}  // namespace dh::chat::jinja
