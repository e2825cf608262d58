// Value helpers: conversion from JSON, Python-style str/repr, json.dumps, equality and ordering.
// Every recursive helper carries a depth and fails past kMaxValueDepth instead of growing the
// stack.
#include "chat/jinja_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

namespace dh::chat::jinja {

const Value* ValueDict::Find(std::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void ValueDict::Set(const std::string& key, Value value) {
  auto it = index_.find(key);
  if (it != index_.end()) {
    items_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(key, std::move(value));
}

double Value::AsDouble() const {
  switch (kind()) {
    case Kind::kBool:
      return bool_value() ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(int_value());
    case Kind::kFloat:
      return float_value();
    default:
      return 0.0;
  }
}

const void* Value::identity() const {
  if (is_list()) return &list();
  if (is_dict()) return &dict();
  if (is_callable()) return &callable();
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_value();
    case Kind::kInt:
      return int_value() != 0;
    case Kind::kFloat:
      return float_value() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().empty();
    case Kind::kDict:
      return dict().size() != 0;
    case Kind::kCallable:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "UndefinedValue";
    case Kind::kNone:
      return "NullValue";
    case Kind::kBool:
      return "BooleanValue";
    case Kind::kInt:
      return "IntegerValue";
    case Kind::kFloat:
      return "FloatValue";
    case Kind::kString:
      return "StringValue";
    case Kind::kList:
      return "ArrayValue";
    case Kind::kDict:
      return "ObjectValue";
    case Kind::kCallable:
      return "FunctionValue";
  }
  return "?";
}

namespace {

Status TooDeep() { return OutOfRange("value nested deeper than {} levels", kMaxValueDepth); }

template <typename Json>
Result<Value> FromJsonAt(const Json& j, int depth) {
  if (depth > kMaxValueDepth) return TooDeep();
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case Json::value_t::string:
      return Value::String(j.template get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) {
        DH_ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      Value d = Value::Dict();
      for (const auto& [k, e] : j.items()) {
        DH_ASSIGN_OR_RETURN(Value v, FromJsonAt(e, depth + 1));
        d.dict().Set(k, std::move(v));
      }
      return d;
    }
    default:
      return InvalidArgument("unsupported JSON value of type {}", j.type_name());
  }
}

Status StrAt(const Value& v, int depth, std::string& out);

Status ReprAt(const Value& v, int depth, std::string& out) {
  if (v.is_string()) {
    out += PyReprString(v.str());
    return Status::Ok();
  }
  return StrAt(v, depth, out);
}

Status StrAt(const Value& v, int depth, std::string& out) {
  if (depth > kMaxValueDepth) return TooDeep();
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Status::Ok();
    case Value::Kind::kNone:
      out += "None";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.bool_value() ? "True" : "False";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.int_value());
      return Status::Ok();
    case Value::Kind::kFloat:
      out += PyFloatRepr(v.float_value());
      return Status::Ok();
    case Value::Kind::kString:
      out += v.str();
      return Status::Ok();
    case Value::Kind::kList: {
      out += '[';
      bool first = true;
      for (const Value& e : v.list()) {
        if (!first) out += ", ";
        first = false;
        DH_RETURN_IF_ERROR(ReprAt(e, depth + 1, out));
      }
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      if (v.dict().is_namespace) out += "<Namespace ";
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += PyReprString(k);
        out += ": ";
        DH_RETURN_IF_ERROR(ReprAt(e, depth + 1, out));
      }
      out += '}';
      if (v.dict().is_namespace) out += '>';
      return Status::Ok();
    }
    case Value::Kind::kCallable:
      out += fmt::format("<function {}>", v.callable().name);
      return Status::Ok();
  }
  return Status::Ok();
}

void JsonString(std::string_view s, std::string& out) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

Status JsonAt(const Value& v, const JsonOptions& o, int depth, std::string& out) {
  if (depth > kMaxValueDepth) return TooDeep();
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator
                               : o.indent >= 0           ? ","
                                                         : ", ";
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent) * level, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return InvalidArgument("tojson: cannot serialize an undefined value '{}'",
                             v.undefined_name());
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.bool_value() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.int_value());
      return Status::Ok();
    case Value::Kind::kFloat: {
      double d = v.float_value();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += PyFloatRepr(d);
      return Status::Ok();
    }
    case Value::Kind::kString:
      JsonString(v.str(), out);
      return Status::Ok();
    case Value::Kind::kList: {
      const ValueList& l = v.list();
      if (l.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        DH_RETURN_IF_ERROR(JsonAt(l[i], o, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items()) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return Status::Ok();
      }
      if (o.sort_keys) {
        std::sort(items.begin(), items.end(),
                  [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        JsonString(items[i]->first, out);
        out += key_sep;
        DH_RETURN_IF_ERROR(JsonAt(items[i]->second, o, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::Ok();
    }
    case Value::Kind::kCallable:
      return InvalidArgument("tojson: cannot serialize function {}", v.callable().name);
  }
  return Status::Ok();
}

bool EqualAt(const Value& a, const Value& b, int depth) {
  if (depth > kMaxValueDepth) return false;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    int64_t x = a.is_bool() ? a.bool_value() : a.int_value();
    int64_t y = b.is_bool() ? b.bool_value() : b.int_value();
    return x == y;
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      const ValueList& x = a.list();
      const ValueList& y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualAt(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const ValueDict& x = a.dict();
      const ValueDict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, e] : x.items()) {
        const Value* other = y.Find(k);
        if (!other || !EqualAt(e, *other, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return a.identity() == b.identity();
    default:
      return false;
  }
}

Result<Value> CopyAt(const Value& v, int depth) {
  if (depth > kMaxValueDepth) return TooDeep();
  if (v.is_list()) {
    ValueList items;
    items.reserve(v.list().size());
    for (const Value& e : v.list()) {
      DH_ASSIGN_OR_RETURN(Value c, CopyAt(e, depth + 1));
      items.push_back(std::move(c));
    }
    return Value::List(std::move(items));
  }
  if (v.is_dict()) {
    Value d = Value::Dict();
    d.dict().is_namespace = v.dict().is_namespace;
    for (const auto& [k, e] : v.dict().items()) {
      DH_ASSIGN_OR_RETURN(Value c, CopyAt(e, depth + 1));
      d.dict().Set(k, std::move(c));
    }
    return d;
  }
  return v;
}

}  // namespace

Result<Value> ValueFromJson(const nlohmann::json& j) { return FromJsonAt(j, 0); }
Result<Value> ValueFromJson(const nlohmann::ordered_json& j) { return FromJsonAt(j, 0); }

Result<std::string> ToStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  DH_RETURN_IF_ERROR(StrAt(v, 0, out));
  return out;
}

std::string PyReprString(std::string_view s) {
  char quote = (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos)
                   ? '"'
                   : '\'';
  std::string out(1, quote);
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

std::string PyFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then Python's layout rule: exponent notation
  // when the decimal exponent is < -4 or >= 16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exp = std::stoi(sci.substr(e_pos + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
    return out;
  }
  if (exp < 0) {
    out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    return out;
  }
  size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len) {
    out += digits + std::string(int_len - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return out;
}

Result<std::string> ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  DH_RETURN_IF_ERROR(JsonAt(v, options, 0, out));
  return out;
}

bool ValuesEqual(const Value& a, const Value& b) { return EqualAt(a, b, 0); }

Result<bool> ValueLess(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() < b.AsDouble();
    int64_t x = a.is_bool() ? a.bool_value() : a.int_value();
    int64_t y = b.is_bool() ? b.bool_value() : b.int_value();
    return x < y;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_list() && b.is_list()) {
    const ValueList& x = a.list();
    const ValueList& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (ValuesEqual(x[i], y[i])) continue;
      return ValueLess(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  return InvalidArgument("cannot compare {} with {}", a.TypeName(), b.TypeName());
}

Result<Value> DeepCopy(const Value& v) { return CopyAt(v, 0); }

std::vector<std::string_view> SplitCodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 1;
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) {
        len = 1;
        break;
      }
    }
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace dh::chat::jinja
