// Normalizer implementations (see normalizer.h).
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

class UnicodeNormalizer : public Normalizer {
 public:
  UnicodeNormalizer(std::string name, int options) : name_(std::move(name)), options_(options) {}
  Status Normalize(std::string* text) const override {
    if (text->empty()) return Status::Ok();
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                                static_cast<utf8proc_ssize_t>(text->size()), &out,
                                static_cast<utf8proc_option_t>(options_));
    if (n < 0) return InvalidArgument("{} normalizer: {}", name_, utf8proc_errmsg(n));
    text->assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
    std::free(out);
    return Status::Ok();
  }

 private:
  std::string name_;
  int options_;
};

class Lowercase : public Normalizer {
 public:
  Status Normalize(std::string* text) const override {
    std::string out;
    out.reserve(text->size());
    for (size_t pos = 0; pos < text->size();) {
      const char32_t cp = NextCodePoint(*text, &pos);
      if (cp == 0x130) {  // 'İ' lowercases to "i" + combining dot above, as in Rust
        out.append("i\xCC\x87");
        continue;
      }
      AppendUtf8(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
    }
    *text = std::move(out);
    return Status::Ok();
  }
};

class Replace : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  Status Normalize(std::string* text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    DH_RETURN_IF_ERROR(re_->FindAll(*text, &matches));
    if (matches.empty()) return Status::Ok();
    std::string out;
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      out.append(*text, prev, b - prev);
      out.append(content_);
      prev = e;
    }
    out.append(*text, prev);
    *text = std::move(out);
    return Status::Ok();
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return Status::Ok();
  }

 private:
  std::string prefix_;
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextCodePoint(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t p = start;
        if (!IsWhitespace(NextCodePoint(*text, &p))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
    return Status::Ok();
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  Status Normalize(std::string* text) const override {
    for (const auto& p : parts_) DH_RETURN_IF_ERROR(p->Normalize(text));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

Result<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& spec,
                                                    const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  DH_ASSIGN_OR_RETURN(const std::string type, GetType(spec, where));
  const std::string at = where + "(" + type + ")";
  if (type == "NFC")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (type == "NFD")
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE));
  if (type == "NFKC") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "NFKD") {
    return std::unique_ptr<Normalizer>(
        new UnicodeNormalizer(type, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
  }
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new Lowercase());
  if (type == "Replace") {
    bool is_regex = false;
    DH_ASSIGN_OR_RETURN(const std::string pattern, GetPattern(spec, "pattern", &is_regex, at));
    DH_ASSIGN_OR_RETURN(const std::string content, GetString(spec, "content", at));
    auto re = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
    if (!re.ok()) return re.status().WithContext(at);
    return std::unique_ptr<Normalizer>(new Replace(std::move(re).value(), content));
  }
  if (type == "Prepend") {
    DH_ASSIGN_OR_RETURN(const std::string prefix, GetString(spec, "prepend", at));
    return std::unique_ptr<Normalizer>(new Prepend(prefix));
  }
  if (type == "Strip") {
    DH_ASSIGN_OR_RETURN(const bool left, GetBoolOr(spec, "strip_left", true, at));
    DH_ASSIGN_OR_RETURN(const bool right, GetBoolOr(spec, "strip_right", true, at));
    return std::unique_ptr<Normalizer>(new Strip(left, right));
  }
  if (type == "Sequence") {
    if (!spec.contains("normalizers") || !spec.at("normalizers").is_array()) {
      return InvalidArgument("{}: expected an array \"normalizers\"", at);
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    const auto& list = spec.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      DH_ASSIGN_OR_RETURN(auto part,
                          ParseNormalizer(list[i], at + ".normalizers[" + std::to_string(i) + "]"));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  return Unsupported("{}: unsupported normalizer type \"{}\"", where, type);
}

}  // namespace dh::tok
