// Pre-tokenizer implementations (see pre_tokenizer.h). The splitting rules follow the Hugging
// Face `tokenizers` semantics: matches and gaps are classified, then merged per behaviour.
#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <functional>

#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

// GPT-2's pre-tokenization regex, used by ByteLevel with use_regex.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

using Ranges = std::vector<std::pair<size_t, size_t>>;

// Runs `find` (matches of one piece) over every span and re-splits with `behavior`.
Status SplitAll(PieceList* pieces, SplitBehavior behavior, bool invert,
                const std::function<Status(std::string_view, Ranges*)>& find) {
  Ranges out, matches;
  out.reserve(pieces->spans.size() * 2);
  for (const auto& [b, e] : pieces->spans) {
    matches.clear();
    DH_RETURN_IF_ERROR(find(std::string_view(pieces->text).substr(b, e - b), &matches));
    SplitByMatches(b, e - b, matches, behavior, invert, &out);
  }
  pieces->spans = std::move(out);
  return Status::Ok();
}

// Every code point for which `pred` holds is one match.
Status FindChars(std::string_view s, const std::function<bool(char32_t)>& pred, Ranges* out) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    if (pred(NextCodePoint(s, &pos))) out->emplace_back(start, pos);
  }
  return Status::Ok();
}

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> re, SplitBehavior behavior, bool invert)
      : re_(std::move(re)), behavior_(behavior), invert_(invert) {}
  Status Apply(PieceList* pieces, bool) const override {
    return SplitAll(pieces, behavior_, invert_,
                    [this](std::string_view s, Ranges* m) { return re_->FindAll(s, m); });
  }

 private:
  std::unique_ptr<Regex> re_;
  SplitBehavior behavior_;
  bool invert_;
};

class CharSplitPreTokenizer : public PreTokenizer {
 public:
  CharSplitPreTokenizer(std::function<bool(char32_t)> pred, SplitBehavior behavior)
      : pred_(std::move(pred)), behavior_(behavior) {}
  Status Apply(PieceList* pieces, bool) const override {
    return SplitAll(pieces, behavior_, false,
                    [this](std::string_view s, Ranges* m) { return FindChars(s, pred_, m); });
  }

 private:
  std::function<bool(char32_t)> pred_;
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  Status Apply(PieceList* pieces, bool) const override {
    if (add_prefix_space_) {
      PieceList spaced;
      spaced.text.reserve(pieces->text.size() + pieces->spans.size());
      for (const auto& [b, e] : pieces->spans) {
        const size_t start = spaced.text.size();
        if (pieces->text[b] != ' ') spaced.text.push_back(' ');
        spaced.text.append(pieces->text, b, e - b);
        spaced.spans.emplace_back(start, spaced.text.size());
      }
      *pieces = std::move(spaced);
    }
    if (re_ != nullptr) {
      DH_RETURN_IF_ERROR(
          SplitAll(pieces, SplitBehavior::kIsolated, false,
                   [this](std::string_view s, Ranges* m) { return re_->FindAll(s, m); }));
    }
    const ByteLevelTable& table = GetByteLevelTable();
    PieceList mapped;
    mapped.text.reserve(pieces->text.size() * 2);
    mapped.spans.reserve(pieces->spans.size());
    for (const auto& [b, e] : pieces->spans) {
      const size_t start = mapped.text.size();
      for (size_t i = b; i < e; ++i) {
        mapped.text.append(table.byte_to_utf8[static_cast<uint8_t>(pieces->text[i])]);
      }
      mapped.spans.emplace_back(start, mapped.text.size());
    }
    *pieces = std::move(mapped);
    return Status::Ok();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  Status Apply(PieceList* pieces, bool at_input_start) const override {
    PieceList out;
    for (const auto& [b, e] : pieces->spans) {
      std::string piece;
      for (size_t i = b; i < e; ++i) {
        if (pieces->text[i] == ' ') {
          piece.append(replacement_);
        } else {
          piece.push_back(pieces->text[i]);
        }
      }
      const bool starts = piece.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::kAlways ||
                      (prepend_ == Prepend::kFirst && at_input_start && b == 0))) {
        piece.insert(0, replacement_);
      }
      const size_t base = out.text.size();
      out.text.append(piece);
      if (!split_) {
        out.spans.emplace_back(base, out.text.size());
        continue;
      }
      Ranges matches;
      for (size_t pos = piece.find(replacement_); pos != std::string::npos;
           pos = piece.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      SplitByMatches(base, piece.size(), matches, SplitBehavior::kMergedWithNext, false,
                     &out.spans);
    }
    *pieces = std::move(out);
    return Status::Ok();
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  Status Apply(PieceList* pieces, bool at_input_start) const override {
    for (const auto& p : parts_) DH_RETURN_IF_ERROR(p->Apply(pieces, at_input_start));
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Result<SplitBehavior> ParseBehavior(const nlohmann::json& spec, const std::string& where) {
  DH_ASSIGN_OR_RETURN(const std::string b, GetString(spec, "behavior", where));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgument("{}.behavior: unknown split behaviour \"{}\"", where, b);
}

std::unique_ptr<PreTokenizer> Own(PreTokenizer* p) { return std::unique_ptr<PreTokenizer>(p); }

}  // namespace

void SplitByMatches(size_t base, size_t len, const Ranges& matches, SplitBehavior behavior,
                    bool invert, Ranges* out) {
  // Classify the piece into consecutive (range, is_match) parts covering it.
  struct Part {
    size_t b, e;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < len) parts.push_back({prev, len, invert});

  std::vector<Part> merged;
  merged.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      merged = parts;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().e = p.e;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t i = parts.size(); i-- > 0;) {
        const Part& p = parts[i];
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().b = p.b;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !merged.empty()) {
          merged.back().e = p.e;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
  }
  for (const Part& p : merged) {
    if (p.e > p.b) out->emplace_back(base + p.b, base + p.e);
  }
}

Result<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& spec,
                                                        const std::string& where) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  DH_ASSIGN_OR_RETURN(const std::string type, GetType(spec, where));
  const std::string at = where + "(" + type + ")";
  if (type == "Split") {
    bool is_regex = false;
    DH_ASSIGN_OR_RETURN(const std::string pattern, GetPattern(spec, "pattern", &is_regex, at));
    DH_ASSIGN_OR_RETURN(const SplitBehavior behavior, ParseBehavior(spec, at));
    DH_ASSIGN_OR_RETURN(const bool invert, GetBoolOr(spec, "invert", false, at));
    auto re = is_regex ? Regex::Compile(pattern) : Regex::Literal(pattern);
    if (!re.ok()) return re.status().WithContext(at);
    return Own(new SplitPreTokenizer(std::move(re).value(), behavior, invert));
  }
  if (type == "ByteLevel") {
    DH_ASSIGN_OR_RETURN(const bool prefix, GetBoolOr(spec, "add_prefix_space", true, at));
    DH_ASSIGN_OR_RETURN(const bool use_regex, GetBoolOr(spec, "use_regex", true, at));
    std::unique_ptr<Regex> re;
    if (use_regex) {
      DH_ASSIGN_OR_RETURN(re, Regex::Compile(kGpt2Pattern));
    }
    return Own(new ByteLevelPreTokenizer(prefix, std::move(re)));
  }
  if (type == "Metaspace") {
    std::string replacement = "\xE2\x96\x81";  // U+2581
    if (spec.contains("replacement")) {
      DH_ASSIGN_OR_RETURN(replacement, GetString(spec, "replacement", at));
    }
    auto prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (spec.contains("prepend_scheme")) {
      DH_ASSIGN_OR_RETURN(const std::string scheme, GetString(spec, "prepend_scheme", at));
      if (scheme == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else if (scheme != "always") {
        return InvalidArgument("{}.prepend_scheme: expected always/first/never, got \"{}\"", at,
                               scheme);
      }
    } else {
      DH_ASSIGN_OR_RETURN(const bool add, GetBoolOr(spec, "add_prefix_space", true, at));
      if (!add) prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    DH_ASSIGN_OR_RETURN(const bool split, GetBoolOr(spec, "split", true, at));
    return Own(new MetaspacePreTokenizer(replacement, prepend, split));
  }
  if (type == "Digits") {
    DH_ASSIGN_OR_RETURN(const bool individual, GetBoolOr(spec, "individual_digits", false, at));
    return Own(new CharSplitPreTokenizer(
        IsNumeric, individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous));
  }
  if (type == "Punctuation") {
    SplitBehavior behavior = SplitBehavior::kIsolated;
    if (spec.contains("behavior")) {
      DH_ASSIGN_OR_RETURN(behavior, ParseBehavior(spec, at));
    }
    return Own(new CharSplitPreTokenizer(IsPunctuation, behavior));
  }
  if (type == "WhitespaceSplit") {
    return Own(new CharSplitPreTokenizer(IsWhitespace, SplitBehavior::kRemoved));
  }
  if (type == "Whitespace") {
    DH_ASSIGN_OR_RETURN(auto re, Regex::Compile(R"(\w+|[^\w\s]+)"));
    return Own(new SplitPreTokenizer(std::move(re), SplitBehavior::kRemoved, true));
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(Own(new CharSplitPreTokenizer(IsWhitespace, SplitBehavior::kRemoved)));
    parts.push_back(Own(new CharSplitPreTokenizer(IsPunctuation, SplitBehavior::kIsolated)));
    return Own(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec.at("pretokenizers").is_array()) {
      return InvalidArgument("{}: expected an array \"pretokenizers\"", at);
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = spec.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      DH_ASSIGN_OR_RETURN(
          auto part, ParsePreTokenizer(list[i], at + ".pretokenizers[" + std::to_string(i) + "]"));
      if (part) parts.push_back(std::move(part));
    }
    return Own(new SequencePreTokenizer(std::move(parts)));
  }
  return Unsupported("{}: unsupported pre-tokenizer type \"{}\"", where, type);
}

}  // namespace dh::tok
