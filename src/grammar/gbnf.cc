// GBNF (llama.cpp's grammar format) to grammar: `name ::= alternatives` rules, "literals",
// [classes] over code points (with ^ and ranges), '.', (groups), the postfix operators * + ?
// {m} {m,} {m,n}, and # comments. The start rule is `root`. A rule continues on the next line
// only after '|' or inside parentheses, as in llama.cpp.
#include <cctype>
#include <map>
#include <set>

#include <fmt/format.h>

#include "grammar/compilers.h"
#include "tokenizer/utf8.h"

namespace dh::grammar {
namespace {

using Seq = GrammarBuilder::Seq;
using GB = GrammarBuilder;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : t_(text) {}

  Result<Grammar> Parse() {
    DH_RETURN_IF_ERROR(tok::ValidateUtf8(t_));
    RuleId("root");
    SkipSpace(true);
    while (!AtEnd()) {
      const size_t at = pos_;
      std::string name = Name();
      if (name.empty()) return Error("expected a rule name");
      SkipSpace(false);
      if (t_.substr(pos_, 3) != "::=") return Error("expected '::='");
      pos_ += 3;
      if (defined_.count(name)) {
        pos_ = at;
        return Error(fmt::format("rule '{}' is defined twice", name));
      }
      defined_.insert(name);
      DH_RETURN_IF_ERROR(Alternatives(RuleId(name), false));
      SkipSpace(true);
    }
    for (const auto& [name, id] : ids_) {
      if (!defined_.count(name)) return InvalidArgument("grammar: rule '{}' is used but not defined", name);
    }
    return b_.Build();
  }

 private:
  Status Error(std::string_view what) const {
    size_t line = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) line += t_[i] == '\n';
    return InvalidArgument("grammar: line {}: {}", line, what);
  }
  bool AtEnd() const { return pos_ >= t_.size(); }
  char Peek() const { return AtEnd() ? '\0' : t_[pos_]; }

  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (!AtEnd() && t_[pos_] != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }
  std::string Name() {
    const size_t start = pos_;
    while (!AtEnd() && (std::isalnum(static_cast<unsigned char>(Peek())) || Peek() == '-' || Peek() == '_')) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }
  int32_t RuleId(const std::string& name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const int32_t id = b_.NewRule(name);
    ids_[name] = id;
    return id;
  }

  Status Alternatives(int32_t rule, bool nested) {
    while (true) {
      Seq seq;
      DH_RETURN_IF_ERROR(Sequence(&seq, nested));
      b_.AddAlt(rule, std::move(seq));
      SkipSpace(nested);
      if (Peek() != '|') return Status::Ok();
      ++pos_;
      SkipSpace(true);
    }
  }

  Status Sequence(Seq* seq, bool nested) {
    while (true) {
      SkipSpace(nested);
      const char c = Peek();
      const size_t before = seq->size();
      Seq atom;
      if (c == '"') {
        ++pos_;
        std::string lit;
        while (!AtEnd() && Peek() != '"') {
          DH_ASSIGN_OR_RETURN(uint32_t cp, Char());
          tok::AppendUtf8(static_cast<char32_t>(cp), &lit);
        }
        if (AtEnd()) return Error("unterminated string");
        ++pos_;
        atom = GB::Literal(lit);
        if (atom.empty()) {
          seq->insert(seq->end(), atom.begin(), atom.end());
          continue;
        }
      } else if (c == '[') {
        DH_ASSIGN_OR_RETURN(atom, Class());
      } else if (c == '.') {
        ++pos_;
        atom = {GB::Ref(b_.CodePointRanges(NewName(), {{0, 0x10FFFF}}))};
      } else if (c == '(') {
        // Groups recurse: bounded so a client's grammar cannot exhaust the stack.
        if (++group_depth_ > kMaxGroupDepth) {
          return Error(fmt::format("groups nested deeper than {}", kMaxGroupDepth));
        }
        ++pos_;
        SkipSpace(true);
        const int32_t group = b_.NewRule(NewName());
        DH_RETURN_IF_ERROR(Alternatives(group, true));
        --group_depth_;
        SkipSpace(true);
        if (Peek() != ')') return Error("expected ')'");
        ++pos_;
        atom = {GB::Ref(group)};
      } else if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') {
        const size_t save = pos_;
        std::string name = Name();
        SkipSpace(false);
        if (t_.substr(pos_, 3) == "::=") {  // the next rule starts here
          pos_ = save;
          return Status::Ok();
        }
        pos_ = save + name.size();
        atom = {GB::Ref(RuleId(name))};
      } else {
        return Status::Ok();
      }
      (void)before;
      DH_RETURN_IF_ERROR(Postfix(&atom));
      seq->insert(seq->end(), atom.begin(), atom.end());
    }
  }

  Status Postfix(Seq* atom) {
    while (true) {
      const char c = Peek();
      int64_t min = 0, max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        ++pos_;
        auto num = [&](int64_t* v) {
          bool got = false;
          *v = 0;
          while (std::isdigit(static_cast<unsigned char>(Peek()))) {
            *v = *v * 10 + (t_[pos_++] - '0');
            got = true;
            if (*v > 100000) return false;
          }
          return got;
        };
        SkipSpace(false);
        if (!num(&min)) return Error("expected a count after '{'");
        SkipSpace(false);
        if (Peek() == ',') {
          ++pos_;
          SkipSpace(false);
          if (!num(&max)) max = -1;
        } else {
          max = min;
        }
        SkipSpace(false);
        if (Peek() != '}') return Error("expected '}'");
        ++pos_;
      } else {
        return Status::Ok();
      }
      auto rep = b_.Repeat(NewName(), *atom, min, max);
      if (!rep.ok()) return Error(rep.status().message());
      *atom = {GB::Ref(*rep)};
    }
  }

  Result<uint32_t> Char() {
    if (AtEnd()) return Error("unexpected end");
    if (Peek() != '\\') {
      size_t p = pos_;
      const char32_t cp = tok::NextCodePoint(t_, &p);
      pos_ = p;
      return static_cast<uint32_t>(cp);
    }
    ++pos_;
    if (AtEnd()) return Error("trailing backslash");
    const char e = t_[pos_++];
    switch (e) {
      case 'n': return uint32_t{'\n'};
      case 't': return uint32_t{'\t'};
      case 'r': return uint32_t{'\r'};
      case 'x':
      case 'u':
      case 'U': {
        const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          const char h = Peek();
          const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return Error("bad hex escape");
          ++pos_;
          v = v * 16 + static_cast<uint32_t>(d);
        }
        if (v > 0x10FFFF) return Error("code point out of range");
        return v;
      }
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<uint32_t>(e);
      default:
        return Error(fmt::format("unknown escape '\\{}'", e));
    }
  }

  Result<Seq> Class() {
    ++pos_;  // '['
    bool negate = false;
    if (Peek() == '^') {
      ++pos_;
      negate = true;
    }
    Ranges r;
    while (true) {
      if (AtEnd()) return Error("unterminated '['");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      DH_ASSIGN_OR_RETURN(uint32_t lo, Char());
      uint32_t hi = lo;
      if (Peek() == '-' && pos_ + 1 < t_.size() && t_[pos_ + 1] != ']') {
        ++pos_;
        DH_ASSIGN_OR_RETURN(hi, Char());
        if (hi < lo) return Error("class range out of order");
      }
      r.emplace_back(lo, hi);
    }
    if (negate) r = ComplementRanges(r);
    r = NormalizeRanges(r);
    if (!r.empty() && r.back().second < 0x80) {
      ByteSet set;
      for (auto [a, b] : r) set.AddRange(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
      return Seq{GB::Bytes(set)};
    }
    return Seq{GB::Ref(b_.CodePointRanges(NewName(), r))};
  }

  std::string NewName() { return fmt::format("gbnf-{}", counter_++); }

  std::string_view t_;
  size_t pos_ = 0;
  static constexpr int kMaxGroupDepth = 100;
  int group_depth_ = 0;
  GrammarBuilder b_;
  std::map<std::string, int32_t> ids_;
  std::set<std::string> defined_;
  int counter_ = 0;
};

}  // namespace

Result<Grammar> CompileGbnf(std::string_view text) {
  if (text.size() > 65536) return InvalidArgument("grammar: longer than 65536 bytes");
  GbnfParser parser(text);
  return parser.Parse();
}

}  // namespace dh::grammar
