// JSON Schema to grammar. Each (sub)schema becomes a rule; $ref targets get one rule each, made
// before their body so recursive schemas just refer back. Output layout is compact (no
// whitespace) unless any_whitespace. Where a schema allows more than a grammar can hold, the
// grammar generates a subset that still validates (declared properties only, in key order;
// numbers of at most 16 integer digits and 2 exponent digits); where a keyword would need more than a grammar can
// enforce, it is an Unsupported error naming it (strict) or skipped and reported (lenient).
// Over 700 lines on purpose: one SchemaCompiler class whose keyword handlers (types, objects,
// arrays, numbers, strings, combinators, $ref) call each other; split across files they would
// need a header exposing the compiler's private state to every part.
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "grammar/compilers.h"

namespace dh::grammar {
namespace {

using Json = nlohmann::json;
using Seq = GrammarBuilder::Seq;
using GB = GrammarBuilder;

// Keywords that never constrain.
const std::set<std::string>& Annotations() {
  static const std::set<std::string> s = {
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
      "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType",
      "contentEncoding", "discriminator", "strict", "name"};
  return s;
}

// Keywords this compiler enforces.
const std::set<std::string>& Handled() {
  static const std::set<std::string> s = {
      "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
      "additionalProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
      "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "nullable"};
  return s;
}

// Regular formats, as regexes whose strings also pass ajv-formats' checks (dates never name a
// day a month lacks; February stops at 28).
const std::map<std::string, std::string>& Formats() {
  static const std::string date =
      "[0-9]{4}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)";
  static const std::string time =
      "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::map<std::string, std::string> f = {
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
      {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
      {"email", "[a-z0-9]{1,20}(\\.[a-z0-9]{1,20}){0,2}@([a-z0-9]{1,20}\\.){1,3}[a-z]{2,10}"},
      {"hostname", "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?){0,3}"},
      {"uri", "https?://[a-z0-9]{1,20}(\\.[a-z0-9]{1,20}){0,3}(/[a-zA-Z0-9._~-]{1,20}){0,4}"},
  };
  return f;
}

constexpr int64_t kMaxDigits = 16;

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options, std::vector<std::string>* ignored)
      : root_(root), options_(options), ignored_(ignored) {}

  Result<Grammar> Run() {
    const int32_t start = b_.NewRule("root");
    DH_ASSIGN_OR_RETURN(int32_t body, Compile(root_, "#", 0));
    Seq s = Ws();
    s.push_back(GB::Ref(body));
    Seq w = Ws();
    s.insert(s.end(), w.begin(), w.end());
    b_.AddAlt(start, s);
    return b_.Build();
  }

  Result<Grammar> AnyObject() {
    const int32_t start = b_.NewRule("root");
    b_.AddAlt(start, {GB::Ref(ObjectAny())});
    return b_.Build();
  }

 private:
  static constexpr int kMaxDepth = 64;

  Status Skip(const std::string& keyword, const std::string& path, const std::string& why) {
    if (options_.strict)
      return Unsupported("JSON Schema keyword '{}' at {}: {}", keyword, path, why);
    if (ignored_) ignored_->push_back(fmt::format("{} at {}", keyword, path));
    return Status::Ok();
  }

  Seq Ws() {
    if (!options_.any_whitespace) return {};
    if (ws_ < 0) {
      ByteSet set;
      for (char c : std::string(" \t\n\r")) set.Add(static_cast<uint8_t>(c));
      ws_ = *b_.Repeat("ws", {GB::Bytes(set)}, 0, kMaxWhitespace);
    }
    return {GB::Ref(ws_)};
  }
  Seq Punct(char c) {
    Seq s = Ws();
    s.push_back(GB::Byte(static_cast<uint8_t>(c)));
    Seq w = Ws();
    s.insert(s.end(), w.begin(), w.end());
    return s;
  }
  int32_t LiteralRule(const std::string& name, const std::string& text) {
    const int32_t r = b_.NewRule(name);
    b_.AddAlt(r, GB::Literal(text));
    return r;
  }

  // One string character (escapes included).
  int32_t Char() {
    if (char_ >= 0) return char_;
    char_ = b_.NewRule("char");
    const int32_t raw = b_.CodePointRanges("char-raw", ComplementRanges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
    b_.AddAlt(char_, {GB::Ref(raw)});
    ByteSet esc;
    for (char c : std::string("\"\\/bfnrt")) esc.Add(static_cast<uint8_t>(c));
    b_.AddAlt(char_, {GB::Byte('\\'), GB::Bytes(esc)});
    ByteSet hex;
    hex.AddRange('0', '9');
    hex.AddRange('a', 'f');
    hex.AddRange('A', 'F');
    // \u escapes of control characters only: a \u of a surrogate could be left unpaired.
    b_.AddAlt(char_, {GB::Byte('\\'), GB::Byte('u'), GB::Byte('0'), GB::Byte('0'),
                      [] { ByteSet s; s.AddRange('0', '1'); return GB::Bytes(s); }(), GB::Bytes(hex)});
    return char_;
  }
  Result<int32_t> StringRule(int64_t min, int64_t max) {
    const std::string key = fmt::format("{}:{}", min, max);
    if (auto it = strings_.find(key); it != strings_.end()) return it->second;
    DH_ASSIGN_OR_RETURN(int32_t chars, b_.Repeat(fmt::format("chars{}-{}", min, max), {GB::Ref(Char())}, min, max));
    const int32_t r = b_.NewRule("string");
    b_.AddAlt(r, {GB::Byte('"'), GB::Ref(chars), GB::Byte('"')});
    strings_[key] = r;
    return r;
  }
  ByteSet Digits(char lo = '0', char hi = '9') {
    ByteSet s;
    s.AddRange(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    return s;
  }
  // 0 | [1-9][0-9]{0,15}
  int32_t NaturalRule() {
    if (natural_ >= 0) return natural_;
    const int32_t tail = *b_.Repeat("digits", {GB::Bytes(Digits())}, 0, kMaxDigits - 1);
    natural_ = b_.NewRule("natural");
    b_.AddAlt(natural_, GB::Literal("0"));
    b_.AddAlt(natural_, {GB::Bytes(Digits('1', '9')), GB::Ref(tail)});
    return natural_;
  }
  int32_t FractionRule() {
    if (fraction_ >= 0) return fraction_;
    const int32_t digits = *b_.Repeat("frac-digits", {GB::Bytes(Digits())}, 1, kMaxDigits);
    fraction_ = b_.NewRule("fraction");
    b_.AddAlt(fraction_, {GB::Byte('.'), GB::Ref(digits)});
    b_.AddAlt(fraction_, {});
    return fraction_;
  }
  int32_t IntegerRule() {
    if (integer_ >= 0) return integer_;
    integer_ = b_.NewRule("integer");
    b_.AddAlt(integer_, {GB::Ref(NaturalRule())});
    b_.AddAlt(integer_, {GB::Byte('-'), GB::Ref(NaturalRule())});
    return integer_;
  }
  int32_t NumberRule() {
    if (number_ >= 0) return number_;
    // Two exponent digits keep every number a finite double.
    const int32_t exp_digits = *b_.Repeat("exp-digits", {GB::Bytes(Digits())}, 1, 2);
    const int32_t exp = b_.NewRule("exponent");
    ByteSet e, sign;
    e.Add('e');
    e.Add('E');
    sign.Add('+');
    sign.Add('-');
    b_.AddAlt(exp, {GB::Bytes(e), GB::Bytes(sign), GB::Ref(exp_digits)});
    b_.AddAlt(exp, {GB::Bytes(e), GB::Ref(exp_digits)});
    b_.AddAlt(exp, {});
    number_ = b_.NewRule("number");
    b_.AddAlt(number_, {GB::Ref(IntegerRule()), GB::Ref(FractionRule()), GB::Ref(exp)});
    return number_;
  }

  // Decimal strings of the integers in [lo, hi], 0 <= lo <= hi, same digit count.
  void SameLengthRange(const std::string& lo, const std::string& hi, Seq prefix, std::vector<Seq>* out) {
    if (lo.empty()) {
      out->push_back(std::move(prefix));
      return;
    }
    const size_t rest = lo.size() - 1;
    auto with = [&](ByteSet set) {
      Seq s = prefix;
      s.push_back(GB::Bytes(set));
      return s;
    };
    if (lo[0] == hi[0]) {
      SameLengthRange(lo.substr(1), hi.substr(1), with(Digits(lo[0], lo[0])), out);
      return;
    }
    if (lo.substr(1) == std::string(rest, '0') && hi.substr(1) == std::string(rest, '9')) {
      Seq s = with(Digits(lo[0], hi[0]));
      for (size_t i = 0; i < rest; ++i) s.push_back(GB::Bytes(Digits()));
      out->push_back(std::move(s));
      return;
    }
    SameLengthRange(lo.substr(1), std::string(rest, '9'), with(Digits(lo[0], lo[0])), out);
    if (lo[0] + 1 <= hi[0] - 1) {
      Seq s = with(Digits(static_cast<char>(lo[0] + 1), static_cast<char>(hi[0] - 1)));
      for (size_t i = 0; i < rest; ++i) s.push_back(GB::Bytes(Digits()));
      out->push_back(std::move(s));
    }
    SameLengthRange(std::string(rest, '0'), hi.substr(1), with(Digits(hi[0], hi[0])), out);
  }
  // Naturals in [lo, hi] (hi < 0: unbounded, up to kMaxDigits digits).
  void NaturalRange(int64_t lo, int64_t hi, const Seq& prefix, std::vector<Seq>* out) {
    const int64_t kCap = 9999999999999999;  // kMaxDigits nines
    if (hi < 0 || hi > kCap) hi = kCap;
    if (lo > hi) return;
    int64_t pow = 1;
    for (int len = 1; len <= kMaxDigits; ++len, pow *= 10) {
      const int64_t first = len == 1 ? 0 : pow, last = pow * 10 - 1;
      const int64_t a = std::max(lo, first), z = std::min(hi, last);
      if (a <= z) SameLengthRange(std::to_string(a), std::to_string(z), prefix, out);
      if (last >= hi) break;
    }
  }

  // integer/number with bounds; `integer`: no fraction.
  Result<int32_t> BoundedNumber(const Json& s, const std::string& path, bool integer) {
    std::optional<double> lo, hi;
    bool lo_excl = false, hi_excl = false;
    auto bound = [&](const char* k, bool lower, bool exclusive) -> Status {
      auto it = s.find(k);
      if (it == s.end() || it->is_boolean()) return Status::Ok();  // draft-4 flags: read below
      if (!it->is_number()) return InvalidArgument("{}/{}: expected a number", path, k);
      const double d = it->get<double>();
      if (!std::isfinite(d) || std::fabs(d) > 1e15)
        return Skip(k, path, "bounds beyond 1e15 are not supported");
      std::optional<double>& v = lower ? lo : hi;
      bool& e = lower ? lo_excl : hi_excl;
      const bool tighter = !v || (lower ? d > *v : d < *v) || (d == *v && exclusive);
      if (tighter) {
        v = d;
        e = exclusive;
      }
      return Status::Ok();
    };
    DH_RETURN_IF_ERROR(bound("minimum", true, false));
    DH_RETURN_IF_ERROR(bound("exclusiveMinimum", true, true));
    DH_RETURN_IF_ERROR(bound("maximum", false, false));
    DH_RETURN_IF_ERROR(bound("exclusiveMaximum", false, true));
    if (auto it = s.find("exclusiveMinimum"); it != s.end() && it->is_boolean() && it->get<bool>()) lo_excl = true;
    if (auto it = s.find("exclusiveMaximum"); it != s.end() && it->is_boolean() && it->get<bool>()) hi_excl = true;
    if (!lo && !hi) return integer ? IntegerRule() : NumberRule();

    std::optional<int64_t> ilo, ihi;  // inclusive integer bounds of the integer part
    if (integer) {
      if (lo) ilo = static_cast<int64_t>(lo_excl ? std::floor(*lo) + 1 : std::ceil(*lo));
      if (hi) ihi = static_cast<int64_t>(hi_excl ? std::ceil(*hi) - 1 : std::floor(*hi));
      if (ilo && ihi && *ilo > *ihi) return InvalidArgument("{}: no integer within the bounds", path);
    } else {
      const bool whole = (!lo || (*lo == std::floor(*lo) && !lo_excl)) && (!hi || (*hi == std::floor(*hi) && !hi_excl));
      if (!whole) {
        DH_RETURN_IF_ERROR(Skip(lo_excl || hi_excl ? "exclusiveMinimum/exclusiveMaximum" : "minimum/maximum",
                                path, "number bounds must be inclusive integers"));
        return NumberRule();
      }
      if (lo) ilo = static_cast<int64_t>(*lo);
      if (hi) ihi = static_cast<int64_t>(*hi);
      if (ilo && ihi && *ilo > *ihi) return InvalidArgument("{}: minimum above maximum", path);
    }
    std::vector<Seq> alts;
    const Seq none, minus = {GB::Byte('-')};
    if (integer) {
      if (!ihi || *ihi >= 0) NaturalRange(std::max<int64_t>(ilo.value_or(0), 0), ihi.value_or(-1), none, &alts);
      if (!ilo || *ilo < 0) NaturalRange(std::max<int64_t>(ihi ? -*ihi : 1, 1), ilo ? -*ilo : -1, minus, &alts);
    } else {
      // value = [-]x[.frac]; x ranges exclude the bound itself, which may only take ".0...".
      const int32_t zeros = *b_.Repeat("zeros", {GB::Byte('0')}, 1, kMaxDigits);
      const int32_t zero_frac = b_.NewRule("zero-frac");
      b_.AddAlt(zero_frac, {GB::Byte('.'), GB::Ref(zeros)});
      b_.AddAlt(zero_frac, {});
      std::vector<Seq> frac_alts, exact_alts;
      if (!ihi || *ihi >= 0) {
        const int64_t a = std::max<int64_t>(ilo.value_or(0), 0);
        if (!ihi) {
          NaturalRange(a, -1, none, &frac_alts);
        } else {
          if (*ihi - 1 >= a) NaturalRange(a, *ihi - 1, none, &frac_alts);
          NaturalRange(*ihi, *ihi, none, &exact_alts);
        }
      }
      if (!ilo || *ilo < 0) {
        const int64_t a = ihi && *ihi < 0 ? -*ihi : 0;
        if (!ilo) {
          NaturalRange(a, -1, minus, &frac_alts);
        } else {
          if (-*ilo - 1 >= a) NaturalRange(a, -*ilo - 1, minus, &frac_alts);
          NaturalRange(-*ilo, -*ilo, minus, &exact_alts);
        }
      }
      for (Seq& s : frac_alts) {
        s.push_back(GB::Ref(FractionRule()));
        alts.push_back(std::move(s));
      }
      for (Seq& s : exact_alts) {
        s.push_back(GB::Ref(zero_frac));
        alts.push_back(std::move(s));
      }
    }
    if (alts.empty()) return InvalidArgument("{}: no number within the bounds", path);
    const int32_t r = b_.NewRule(integer ? "int-range" : "num-range");
    for (Seq& s : alts) b_.AddAlt(r, std::move(s));
    return r;
  }

  int32_t ValueAny() {
    if (value_ >= 0) return value_;
    value_ = b_.NewRule("value");
    const int32_t str = *StringRule(0, -1);
    const int32_t obj = b_.NewRule("object");
    const int32_t arr = b_.NewRule("array");
    b_.AddAlt(value_, {GB::Ref(obj)});
    b_.AddAlt(value_, {GB::Ref(arr)});
    b_.AddAlt(value_, {GB::Ref(str)});
    b_.AddAlt(value_, {GB::Ref(NumberRule())});
    for (const char* lit : {"true", "false", "null"}) b_.AddAlt(value_, GB::Literal(lit));
    Seq member = {GB::Ref(str)};
    for (auto& it : Punct(':')) member.push_back(it);
    member.push_back(GB::Ref(value_));
    const int32_t members = *b_.Repeat("members", member, 0, -1, Punct(','));
    Seq o = Punct('{');
    o.push_back(GB::Ref(members));
    for (auto& it : Punct('}')) o.push_back(it);
    b_.AddAlt(obj, o);
    const int32_t elems = *b_.Repeat("elements", {GB::Ref(value_)}, 0, -1, Punct(','));
    Seq a = Punct('[');
    a.push_back(GB::Ref(elems));
    for (auto& it : Punct(']')) a.push_back(it);
    b_.AddAlt(arr, a);
    object_any_ = obj;
    return value_;
  }
  int32_t ObjectAny() {
    ValueAny();
    return object_any_;
  }

  Result<int32_t> Compile(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) return InvalidArgument("{}: schema nested deeper than {}", path, kMaxDepth);
    if (s.is_boolean()) {
      if (s.get<bool>()) return ValueAny();
      return Unsupported("{}: the schema 'false' matches nothing", path);
    }
    if (!s.is_object()) return InvalidArgument("{}: a schema must be an object or a boolean", path);
    for (const auto& [k, v] : s.items()) {
      if (Handled().count(k) || Annotations().count(k)) continue;
      if (k == "uniqueItems" && v.is_boolean() && !v.get<bool>()) continue;
      if (k == "additionalItems") continue;
      DH_RETURN_IF_ERROR(Skip(k, path, "not supported by the grammar compiler"));
    }
    if (auto it = s.find("nullable"); it != s.end() && it->is_boolean() && it->get<bool>()) {
      Json copy = s;
      copy.erase("nullable");
      DH_ASSIGN_OR_RETURN(int32_t inner, Compile(copy, path, depth + 1));
      const int32_t r = b_.NewRule("nullable");
      b_.AddAlt(r, {GB::Ref(inner)});
      b_.AddAlt(r, GB::Literal("null"));
      return r;
    }
    if (auto it = s.find("$ref"); it != s.end()) return CompileRef(s, *it, path, depth);
    if (auto it = s.find("const"); it != s.end()) return LiteralRule("const", it->dump());
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) return InvalidArgument("{}/enum: expected a non-empty array", path);
      const int32_t r = b_.NewRule("enum");
      for (const Json& v : *it) b_.AddAlt(r, GB::Literal(v.dump()));
      return r;
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      auto it = s.find(k);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty()) return InvalidArgument("{}/{}: expected a non-empty array", path, k);
      Json base = s;
      base.erase(k);
      const bool merge = HasConstraints(base);
      const int32_t r = b_.NewRule(k);
      for (size_t i = 0; i < it->size(); ++i) {
        Json branch = (*it)[i];
        if (merge) {
          DH_ASSIGN_OR_RETURN(branch, MergeAll({base, Deref(branch)}, path));
        }
        DH_ASSIGN_OR_RETURN(int32_t alt, Compile(branch, fmt::format("{}/{}/{}", path, k, i), depth + 1));
        b_.AddAlt(r, {GB::Ref(alt)});
      }
      return r;
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->empty()) return InvalidArgument("{}/allOf: expected a non-empty array", path);
      std::vector<Json> parts;
      Json base = s;
      base.erase("allOf");
      if (HasConstraints(base)) parts.push_back(base);
      for (const Json& p : *it) parts.push_back(Deref(p));
      DH_ASSIGN_OR_RETURN(Json merged, MergeAll(parts, path + "/allOf"));
      return Compile(merged, path, depth + 1);
    }

    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array()) {
        for (const Json& t : *it) {
          if (!t.is_string()) return InvalidArgument("{}/type: expected strings", path);
          types.push_back(t.get<std::string>());
        }
      } else {
        return InvalidArgument("{}/type: expected a string or an array", path);
      }
    } else {
      auto has = [&](std::initializer_list<const char*> ks) {
        for (const char* k : ks)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
      if (types.empty()) return ValueAny();
    }
    if (types.size() == 1) return CompileType(s, types[0], path, depth);
    const int32_t r = b_.NewRule("types");
    for (const std::string& t : types) {
      DH_ASSIGN_OR_RETURN(int32_t alt, CompileType(s, t, path, depth));
      b_.AddAlt(r, {GB::Ref(alt)});
    }
    return r;
  }

  static bool HasConstraints(const Json& s) {
    for (const auto& [k, v] : s.items())
      if (!Annotations().count(k)) return true;
    return false;
  }

  Json Deref(const Json& s) {
    for (int hops = 0; hops < 16 && s.is_object() && s.contains("$ref") && s.size() == 1; ++hops) {
      auto target = Resolve(s["$ref"]);
      if (!target.ok()) return s;
      return Deref(**target);
    }
    return s;
  }

  // allOf of object schemas (and plain type agreement): union of properties and required.
  Result<Json> MergeAll(const std::vector<Json>& parts, const std::string& path) {
    Json out = Json::object();
    for (const Json& p : parts) {
      if (!p.is_object()) return Unsupported("{}: allOf of a non-object schema", path);
      for (const auto& [k, v] : p.items()) {
        if (Annotations().count(k)) continue;
        if (k == "properties") {
          for (const auto& [pk, pv] : v.items()) {
            if (out["properties"].contains(pk))
              return Unsupported("JSON Schema keyword 'allOf' at {}: property '{}' is constrained twice", path, pk);
            out["properties"][pk] = pv;
          }
        } else if (k == "required") {
          for (const Json& r : v) out["required"].push_back(r);
        } else if (!out.contains(k) || out[k] == v) {
          out[k] = v;
        } else {
          return Unsupported("JSON Schema keyword 'allOf' at {}: '{}' differs between branches", path, k);
        }
      }
    }
    return out;
  }

  Result<const Json*> Resolve(const Json& ref) {
    if (!ref.is_string()) return InvalidArgument("$ref: expected a string");
    const std::string r = ref.get<std::string>();
    if (r == "#") return &root_;
    if (r.rfind("#/", 0) != 0) return Unsupported("$ref '{}': only local references (#/...) are supported", r);
    try {
      const Json::json_pointer ptr(r.substr(1));
      if (!root_.contains(ptr)) return InvalidArgument("$ref '{}': no such definition", r);
      return &root_.at(ptr);
    } catch (const std::exception&) {
      return InvalidArgument("$ref '{}': not a valid JSON pointer", r);
    }
  }

  Result<int32_t> CompileRef(const Json& s, const Json& ref, const std::string& path, int depth) {
    for (const auto& [k, v] : s.items()) {
      if (k != "$ref" && !Annotations().count(k))
        DH_RETURN_IF_ERROR(Skip(k, path, "keywords beside $ref are not supported"));
    }
    DH_ASSIGN_OR_RETURN(const Json* target, Resolve(ref));
    const std::string key = ref.get<std::string>();
    if (auto it = refs_.find(key); it != refs_.end()) return it->second;
    const int32_t r = b_.NewRule("ref:" + key);
    refs_[key] = r;
    DH_ASSIGN_OR_RETURN(int32_t body, Compile(*target, key, depth + 1));
    b_.AddAlt(r, {GB::Ref(body)});
    return r;
  }

  Result<int64_t> Count(const Json& s, const char* k, int64_t fallback, const std::string& path) {
    auto it = s.find(k);
    if (it == s.end()) return fallback;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      return InvalidArgument("{}/{}: expected a non-negative integer", path, k);
    return it->get<int64_t>();
  }

  Result<int32_t> CompileType(const Json& s, const std::string& type, const std::string& path, int depth) {
    if (type == "null") return LiteralRule("null", "null");
    if (type == "boolean") {
      const int32_t r = b_.NewRule("boolean");
      b_.AddAlt(r, GB::Literal("true"));
      b_.AddAlt(r, GB::Literal("false"));
      return r;
    }
    if (type == "integer") return BoundedNumber(s, path, true);
    if (type == "number") return BoundedNumber(s, path, false);
    if (type == "string") return CompileString(s, path);
    if (type == "array") return CompileArray(s, path, depth);
    if (type == "object") return CompileObject(s, path, depth);
    return InvalidArgument("{}/type: unknown type '{}'", path, type);
  }

  Result<int32_t> CompileString(const Json& s, const std::string& path) {
    DH_ASSIGN_OR_RETURN(int64_t min, Count(s, "minLength", 0, path));
    DH_ASSIGN_OR_RETURN(int64_t max, Count(s, "maxLength", -1, path));
    std::optional<std::string> regex;
    if (auto it = s.find("format"); it != s.end()) {
      const std::string f = it->is_string() ? it->get<std::string>() : "";
      auto known = Formats().find(f);
      if (known == Formats().end()) {
        DH_RETURN_IF_ERROR(Skip("format", path, fmt::format("format '{}' is not supported", f)));
      } else {
        regex = known->second;
      }
    }
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return InvalidArgument("{}/pattern: expected a string", path);
      if (regex) {
        DH_RETURN_IF_ERROR(Skip("pattern", path, "pattern together with format is not supported"));
      } else {
        std::string p = it->get<std::string>();
        const bool anchored_start = !p.empty() && p.front() == '^';
        const bool anchored_end = p.size() >= 2 && p.back() == '$' && p[p.size() - 2] != '\\';
        const std::string core = p.substr(anchored_start ? 1 : 0,
                                          p.size() - (anchored_start ? 1 : 0) - (anchored_end ? 1 : 0));
        p = (anchored_start ? "" : ".*") + ("(" + core + ")") + (anchored_end ? "" : ".*");
        regex = p;
      }
    }
    if (regex) {
      if (min != 0 || max >= 0)
        DH_RETURN_IF_ERROR(Skip("minLength/maxLength", path, "length bounds together with pattern or format are not supported"));
      DH_ASSIGN_OR_RETURN(int32_t body, AddRegexRule(&b_, *regex, "pattern", /*json_string_safe=*/true));
      const int32_t r = b_.NewRule("pattern-string");
      b_.AddAlt(r, {GB::Byte('"'), GB::Ref(body), GB::Byte('"')});
      return r;
    }
    return StringRule(min, max);
  }

  Result<int32_t> CompileArray(const Json& s, const std::string& path, int depth) {
    DH_ASSIGN_OR_RETURN(int64_t min, Count(s, "minItems", 0, path));
    DH_ASSIGN_OR_RETURN(int64_t max, Count(s, "maxItems", -1, path));
    if (max >= 0 && max < min) return InvalidArgument("{}: maxItems below minItems", path);
    const Json* prefix = nullptr;
    const Json* items = nullptr;
    if (auto it = s.find("prefixItems"); it != s.end()) prefix = &*it;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array() && !prefix) {
        prefix = &*it;
        if (auto ai = s.find("additionalItems"); ai != s.end()) items = &*ai;
      } else {
        items = &*it;
      }
    }
    const int32_t r = b_.NewRule("array");
    Seq seq = Punct('[');
    int64_t n_prefix = 0;
    if (prefix) {
      if (!prefix->is_array()) return InvalidArgument("{}/prefixItems: expected an array", path);
      n_prefix = static_cast<int64_t>(prefix->size());
      if (max >= 0 && n_prefix > max) return Unsupported("{}: more prefixItems than maxItems", path);
      for (int64_t i = 0; i < n_prefix; ++i) {
        DH_ASSIGN_OR_RETURN(int32_t item, Compile((*prefix)[i], fmt::format("{}/prefixItems/{}", path, i), depth + 1));
        if (i > 0) {
          Seq c = Punct(',');
          seq.insert(seq.end(), c.begin(), c.end());
        }
        seq.push_back(GB::Ref(item));
      }
    }
    // Items after the prefix: all of them when there is no prefix; otherwise only as many as
    // minItems asks for (fewer is still valid).
    const int64_t rest_min = std::max<int64_t>(0, min - n_prefix);
    const int64_t rest_max = prefix ? rest_min : (max >= 0 ? max : -1);
    if (rest_max != 0) {
      if (items && items->is_boolean() && !items->get<bool>())
        return InvalidArgument("{}: minItems needs items beyond prefixItems but items is false", path);
      int32_t item;
      if (items) {
        DH_ASSIGN_OR_RETURN(item, Compile(*items, path + "/items", depth + 1));
      } else {
        item = ValueAny();
      }
      DH_ASSIGN_OR_RETURN(int32_t rep, b_.Repeat("items", {GB::Ref(item)}, rest_min, rest_max, Punct(',')));
      if (n_prefix > 0) {
        // A comma before the extra items: only present when there are any (rest_min > 0 here).
        Seq c = Punct(',');
        seq.insert(seq.end(), c.begin(), c.end());
      }
      seq.push_back(GB::Ref(rep));
    }
    Seq close = Punct(']');
    seq.insert(seq.end(), close.begin(), close.end());
    b_.AddAlt(r, seq);
    return r;
  }

  Result<int32_t> CompileObject(const Json& s, const std::string& path, int depth) {
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return InvalidArgument("{}/properties: expected an object", path);
      props = &*it;
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument("{}/required: expected an array", path);
      for (const Json& r : *it) {
        if (!r.is_string()) return InvalidArgument("{}/required: expected strings", path);
        required.insert(r.get<std::string>());
      }
    }
    const Json* additional = nullptr;
    if (auto it = s.find("additionalProperties"); it != s.end()) additional = &*it;
    const bool no_props = !props || props->empty();
    if (no_props && required.empty()) {
      if (!additional || (additional->is_boolean() && additional->get<bool>())) return ObjectAny();
      if (additional->is_boolean()) return LiteralRule("empty-object", "{}");
      // A map: string keys, values of one schema.
      DH_ASSIGN_OR_RETURN(int32_t value, Compile(*additional, path + "/additionalProperties", depth + 1));
      Seq member = {GB::Ref(*StringRule(0, -1))};
      for (auto& it : Punct(':')) member.push_back(it);
      member.push_back(GB::Ref(value));
      DH_ASSIGN_OR_RETURN(int32_t members, b_.Repeat("map", member, 0, -1, Punct(',')));
      const int32_t r = b_.NewRule("map-object");
      Seq o = Punct('{');
      o.push_back(GB::Ref(members));
      for (auto& it : Punct('}')) o.push_back(it);
      b_.AddAlt(r, o);
      return r;
    }
    // Declared properties in key order; required ones always, optional ones may be skipped.
    struct Prop {
      std::string name;
      int32_t rule;
      bool required;
    };
    std::vector<Prop> list;
    if (props) {
      for (const auto& [name, sub] : props->items()) {
        DH_ASSIGN_OR_RETURN(int32_t v, Compile(sub, path + "/properties/" + name, depth + 1));
        list.push_back({name, v, required.count(name) > 0});
      }
    }
    for (const std::string& name : required) {
      if (props && props->contains(name)) continue;
      if (additional && additional->is_boolean() && !additional->get<bool>())
        return InvalidArgument("{}: required property '{}' is not allowed by additionalProperties", path, name);
      int32_t v = ValueAny();
      if (additional && !additional->is_boolean()) {
        DH_ASSIGN_OR_RETURN(v, Compile(*additional, path + "/additionalProperties", depth + 1));
      }
      list.push_back({name, v, true});
    }
    // tail[i][c]: properties i.. when a comma is (c=1) or is not (c=0) needed before the next.
    const size_t n = list.size();
    std::vector<std::array<int32_t, 2>> tail(n + 1);
    tail[n][0] = tail[n][1] = b_.NewRule("props-end");
    b_.AddAlt(tail[n][0], {});
    for (size_t i = n; i-- > 0;) {
      for (int c = 0; c < 2; ++c) {
        const int32_t r = b_.NewRule(fmt::format("props{}-{}", i, c));
        Seq s1;
        if (c) s1 = Punct(',');
        for (auto& it : GB::Literal(Json(list[i].name).dump())) s1.push_back(it);
        for (auto& it : Punct(':')) s1.push_back(it);
        s1.push_back(GB::Ref(list[i].rule));
        s1.push_back(GB::Ref(tail[i + 1][1]));
        b_.AddAlt(r, s1);
        if (!list[i].required) b_.AddAlt(r, {GB::Ref(tail[i + 1][c])});
        tail[i][c] = r;
      }
    }
    const int32_t r = b_.NewRule("object");
    Seq o = Punct('{');
    o.push_back(GB::Ref(tail[0][0]));
    for (auto& it : Punct('}')) o.push_back(it);
    b_.AddAlt(r, o);
    return r;
  }

  GrammarBuilder b_;
  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::string>* ignored_;
  std::map<std::string, int32_t> refs_, strings_;
  int32_t ws_ = -1, char_ = -1, natural_ = -1, fraction_ = -1, integer_ = -1, number_ = -1;
  int32_t value_ = -1, object_any_ = -1;
};

}  // namespace

Result<Grammar> CompileJsonSchema(const nlohmann::json& schema, const JsonSchemaOptions& options,
                                  std::vector<std::string>* ignored) {
  SchemaCompiler c(schema, options, ignored);
  return c.Run();
}

Result<Grammar> CompileJsonObject() {
  const nlohmann::json empty = nlohmann::json::object();
  SchemaCompiler c(empty, JsonSchemaOptions{}, nullptr);
  return c.AnyObject();
}

}  // namespace dh::grammar
