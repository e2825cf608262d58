// Decoder implementations (see decoder.h), mirroring `tokenizers` token-by-token behaviour.
#include "tokenizer/decoder.h"

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

using Tokens = std::vector<std::string>;

// Maps byte-level characters back to bytes; a token with any other character is kept as its
// raw UTF-8 (added tokens). Invalid UTF-8 in the result becomes U+FFFD.
class ByteLevelDecoder : public Decoder {
 public:
  Status Decode(Tokens* tokens) const override {
    const ByteLevelTable& table = GetByteLevelTable();
    std::string bytes, token_bytes;
    for (const std::string& t : *tokens) {
      token_bytes.clear();
      bool mapped = true;
      for (size_t pos = 0; pos < t.size() && mapped;) {
        const char32_t cp = NextCodePoint(t, &pos);
        const int b = cp < table.char_to_byte.size() ? table.char_to_byte[cp] : -1;
        if (b < 0) {
          mapped = false;
        } else {
          token_bytes.push_back(static_cast<char>(b));
        }
      }
      bytes.append(mapped ? token_bytes : t);
    }
    tokens->assign(1, Utf8Lossy(bytes));
    return Status::Ok();
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  Status Decode(Tokens* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string out;
      const std::string& t = (*tokens)[i];
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      if (i == 0 && strip_first_ && !out.empty() && out[0] == ' ') out.erase(0, 1);
      (*tokens)[i] = std::move(out);
    }
    return Status::Ok();
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class ByteFallbackDecoder : public Decoder {
 public:
  Status Decode(Tokens* tokens) const override {
    Tokens out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (ValidateUtf8(pending).ok()) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : *tokens) {
      int value = -1;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') {
        value = 0;
        for (size_t i = 3; i < 5 && value >= 0; ++i) {
          const char c = t[i];
          const int d = (c >= '0' && c <= '9')   ? c - '0'
                        : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                        : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                                                 : -1;
          value = d < 0 ? -1 : value * 16 + d;
        }
      }
      if (value >= 0) {
        pending.push_back(static_cast<char>(value));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
    return Status::Ok();
  }
};

class FuseDecoder : public Decoder {
 public:
  Status Decode(Tokens* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all.append(t);
    tokens->assign(1, std::move(all));
    return Status::Ok();
  }
};

class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  Status Decode(Tokens* tokens) const override {
    if (content_.empty()) return Status::Ok();
    for (std::string& t : *tokens) {
      size_t b = 0, e = t.size();
      for (size_t i = 0;
           i < start_ && t.compare(b, content_.size(), content_) == 0 && b + content_.size() <= e;
           ++i) {
        b += content_.size();
      }
      for (size_t i = 0; i < stop_ && e >= b + content_.size() &&
                         t.compare(e - content_.size(), content_.size(), content_) == 0;
           ++i) {
        e -= content_.size();
      }
      t = t.substr(b, e - b);
    }
    return Status::Ok();
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Regex> re, std::string content)
      : re_(std::move(re)), content_(std::move(content)) {}
  Status Decode(Tokens* tokens) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (std::string& t : *tokens) {
      matches.clear();
      DH_RETURN_IF_ERROR(re_->FindAll(t, &matches));
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        out.append(t, prev, b - prev);
        out.append(content_);
        prev = e;
      }
      out.append(t, prev);
      t = std::move(out);
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<Regex> re_;
  std::string content_;
};

// BPEDecoder: the end-of-word suffix becomes a space (nothing after the last token).
class SuffixDecoder : public Decoder {
 public:
  explicit SuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  Status Decode(Tokens* tokens) const override {
    if (suffix_.empty()) return Status::Ok();
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      const std::string with = i + 1 == tokens->size() ? "" : " ";
      std::string out;
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, suffix_.size(), suffix_) == 0) {
          out.append(with);
          pos += suffix_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      t = std::move(out);
    }
    return Status::Ok();
  }

 private:
  std::string suffix_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  Status Decode(Tokens* tokens) const override {
    for (const auto& p : parts_) DH_RETURN_IF_ERROR(p->Decode(tokens));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

std::unique_ptr<Decoder> Own(Decoder* d) { return std::unique_ptr<Decoder>(d); }

}  // namespace

Result<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& spec,
                                              const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  DH_ASSIGN_OR_RETURN(const std::string type, GetType(spec, where));
  const std::string at = where + "(" + type + ")";
  if (type == "ByteLevel") return Own(new ByteLevelDecoder());
  if (type == "ByteFallback") return Own(new ByteFallbackDecoder());
  if (type == "Fuse") return Own(new FuseDecoder());
  if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";
    if (spec.contains("replacement")) {
      DH_ASSIGN_OR_RETURN(replacement, GetString(spec, "replacement", at));
    }
    bool strip = true;
    if (spec.contains("prepend_scheme")) {
      DH_ASSIGN_OR_RETURN(const std::string scheme, GetString(spec, "prepend_scheme", at));
      strip = scheme != "never";
    } else {
      DH_ASSIGN_OR_RETURN(strip, GetBoolOr(spec, "add_prefix_space", true, at));
    }
    return Own(new MetaspaceDecoder(replacement, strip));
  }
  if (type == "Strip") {
    DH_ASSIGN_OR_RETURN(const std::string content, GetString(spec, "content", at));
    DH_ASSIGN_OR_RETURN(const int64_t start, GetIntOr(spec, "start", 0, at));
    DH_ASSIGN_OR_RETURN(const int64_t stop, GetIntOr(spec, "stop", 0, at));
    if (start < 0 || stop < 0) return InvalidArgument("{}: start/stop must be >= 0", at);
    return Own(new StripDecoder(content, static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Replace") {
    bool is_regex = false;
    DH_ASSIGN_OR_RETURN(const std::string pattern, GetPattern(spec, "pattern", &is_regex, at));
    DH_ASSIGN_OR_RETURN(const std::string content, GetString(spec, "content", at));
    auto re = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
    if (!re.ok()) return re.status().WithContext(at);
    return Own(new ReplaceDecoder(std::move(re).value(), content));
  }
  if (type == "BPEDecoder") {
    DH_ASSIGN_OR_RETURN(const std::string suffix, GetStringOr(spec, "suffix", "</w>", at));
    return Own(new SuffixDecoder(suffix));
  }
  if (type == "Sequence") {
    if (!spec.contains("decoders") || !spec.at("decoders").is_array()) {
      return InvalidArgument("{}: expected an array \"decoders\"", at);
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    const auto& list = spec.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      DH_ASSIGN_OR_RETURN(auto part,
                          ParseDecoder(list[i], at + ".decoders[" + std::to_string(i) + "]"));
      if (part) parts.push_back(std::move(part));
    }
    return Own(new SequenceDecoder(std::move(parts)));
  }
  return Unsupported("{}: unsupported decoder type \"{}\"", where, type);
}

}  // namespace dh::tok
