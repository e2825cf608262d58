// Values of the chat-template interpreter: Python-like undefined/none/bool/int/float/str/list/dict
// and callables. Lists and dicts are shared by reference (as in Python); dicts keep insertion
// order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"

namespace dh::chat::jinja {

class Value;
class ValueDict;
struct CallArgs;
struct Callable;
using ValueList = std::vector<Value>;

struct UndefinedTag {
  std::string name;  // what was looked up, for error messages
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() : v_(UndefinedTag{}) {}
  static Value Undefined(std::string name) { return Value(UndefinedTag{std::move(name)}); }
  static Value None() { return Value(nullptr); }
  static Value Bool(bool b) { return Value(b); }
  static Value Int(int64_t i) { return Value(i); }
  static Value Float(double d) { return Value(d); }
  static Value String(std::string s) {
    return Value(std::make_shared<const std::string>(std::move(s)));
  }
  static Value List(ValueList items = {}) {
    return Value(std::make_shared<ValueList>(std::move(items)));
  }
  static Value Dict();
  static Value Function(std::string name, std::function<Result<Value>(CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_callable() const { return kind() == Kind::kCallable; }

  bool bool_value() const { return std::get<bool>(v_); }
  int64_t int_value() const { return std::get<int64_t>(v_); }
  double float_value() const { return std::get<double>(v_); }
  // Numeric value of a bool, int or float.
  double AsDouble() const;
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  const std::string& undefined_name() const { return std::get<UndefinedTag>(v_).name; }
  ValueList& list() const { return *std::get<std::shared_ptr<ValueList>>(v_); }
  ValueDict& dict() const { return *std::get<std::shared_ptr<ValueDict>>(v_); }
  Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  // Identity of a list or dict (for `is sameas`).
  const void* identity() const;

  // Python truthiness.
  bool Truthy() const;
  // The type name used in error messages ("StringValue", "NullValue", ...).
  const char* TypeName() const;

 private:
  template <typename T>
  explicit Value(T v) : v_(std::move(v)) {}

  // Strings are shared and immutable, so reading a long string from a variable does not copy it.
  std::variant<UndefinedTag, std::nullptr_t, bool, int64_t, double,
               std::shared_ptr<const std::string>, std::shared_ptr<ValueList>,
               std::shared_ptr<ValueDict>, std::shared_ptr<Callable>>
      v_;
};

// Defined after Value so that every container of Value (a pair<string, Value> included) is
// instantiated with Value complete; libstdc++ with clang rejects the other order.
// Insertion-ordered string-keyed map.
class ValueDict {
 public:
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
  size_t size() const { return items_.size(); }
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  // A namespace() object: attributes may be assigned with `{% set ns.x = ... %}`.
  bool is_namespace = false;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::pair<std::string, Value>> items_;
  std::unordered_map<std::string, size_t, StringHash, std::equal_to<>> index_;
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  std::function<Result<Value>(CallArgs&)> fn;
};

inline Value Value::Dict() { return Value(std::make_shared<ValueDict>()); }
inline Value Value::Function(std::string name, std::function<Result<Value>(CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

// Limits on how deeply nested values may be for the recursive helpers below.
inline constexpr int kMaxValueDepth = 256;

// Converts JSON (messages, tools, ...) to a Value. Fails beyond kMaxValueDepth nesting. Objects
// keep the JSON object's key order (use nlohmann::ordered_json to keep the order of the input).
Result<Value> ValueFromJson(const nlohmann::json& j);
Result<Value> ValueFromJson(const nlohmann::ordered_json& j);

// Python's str(): strings as-is, None -> "None", True -> "True", floats like repr(), lists and
// dicts like Python's repr of them. Undefined renders as "".
Result<std::string> ToStr(const Value& v);
// Python's repr() of a string: 'text' with escapes.
std::string PyReprString(std::string_view s);
// Python's repr() of a float: 1.0, 0.1, 1e+16, inf, nan.
std::string PyFloatRepr(double d);

struct JsonOptions {
  int indent = -1;             // < 0: one line
  std::string item_separator;  // empty: json.dumps default for the indent
  std::string key_separator;
  bool sort_keys = false;
};
// json.dumps(v, ensure_ascii=False, ...) as Hugging Face's tojson filter does it.
Result<std::string> ToJson(const Value& v, const JsonOptions& options);

// Python ==.
bool ValuesEqual(const Value& a, const Value& b);
// Python <; an error for types that do not order.
Result<bool> ValueLess(const Value& a, const Value& b);

// A copy of containers down to the leaves, so a namespace attribute never aliases or contains
// itself. Fails beyond kMaxValueDepth nesting.
Result<Value> DeepCopy(const Value& v);

// UTF-8 code points of a string (invalid bytes are kept as one-byte units).
std::vector<std::string_view> SplitCodePoints(std::string_view s);

}  // namespace dh::chat::jinja
