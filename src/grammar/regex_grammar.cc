// Regular expressions to grammar rules: a recursive-descent parser over code points; groups
// become rules, quantifiers become GrammarBuilder::Repeat. Anchors at the ends are accepted (the
// match is always the whole string); lookaround, backreferences and \b are Unsupported.
#include <fmt/format.h>

#include "grammar/compilers.h"
#include "tokenizer/utf8.h"

namespace dh::grammar {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
using Seq = GrammarBuilder::Seq;

class RegexParser {
 public:
  RegexParser(GrammarBuilder* b, std::string_view pattern, std::string name, bool json_safe)
      : b_(b), p_(pattern), name_(std::move(name)), json_safe_(json_safe) {}

  Result<int32_t> Parse() {
    DH_ASSIGN_OR_RETURN(int32_t rule, Alternation());
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    return rule;
  }

 private:
  Status Error(std::string_view what) const {
    return InvalidArgument("regex '{}': {} at offset {}", p_, what, pos_);
  }
  Status Unsupp(std::string_view what) const {
    return Unsupported("regex '{}': {} is not supported (offset {})", p_, what, pos_);
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char32_t Peek() const {
    size_t p = pos_;
    return tok::NextCodePoint(p_, &p);
  }
  char32_t Next() { return tok::NextCodePoint(p_, &pos_); }

  std::string NewName() { return fmt::format("{}-{}", name_, counter_++); }

  Result<int32_t> Alternation() {
    const int32_t rule = b_->NewRule(NewName());
    while (true) {
      DH_ASSIGN_OR_RETURN(Seq seq, Concat());
      b_->AddAlt(rule, std::move(seq));
      if (AtEnd() || Peek() != '|') break;
      Next();
    }
    return rule;
  }

  Result<Seq> Concat() {
    Seq seq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      const size_t start = pos_;
      DH_ASSIGN_OR_RETURN(Seq atom, Atom());
      DH_ASSIGN_OR_RETURN(bool quantified, Quantifier(&atom, start));
      (void)quantified;
      seq.insert(seq.end(), atom.begin(), atom.end());
    }
    return seq;
  }

  // Applies any quantifiers after an atom.
  Result<bool> Quantifier(Seq* atom, size_t atom_start) {
    bool any = false;
    while (!AtEnd()) {
      const char32_t c = Peek();
      int64_t min = 0, max = -1;
      if (c == '*') {
        Next();
      } else if (c == '+') {
        Next();
        min = 1;
      } else if (c == '?') {
        Next();
        max = 1;
      } else if (c == '{') {
        const size_t save = pos_;
        Next();
        auto num = [&](int64_t* v) {
          bool got = false;
          *v = 0;
          while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
            *v = *v * 10 + (Next() - '0');
            got = true;
            if (*v > 100000) return false;
          }
          return got;
        };
        if (!num(&min)) {
          pos_ = save;  // a literal '{'
          return any;
        }
        if (!AtEnd() && Peek() == ',') {
          Next();
          if (!num(&max)) max = -1;
        } else {
          max = min;
        }
        if (AtEnd() || Next() != '}') return Error("unterminated '{'");
      } else {
        return any;
      }
      if (!AtEnd() && (Peek() == '?' || Peek() == '+')) Next();  // lazy/possessive: same language
      if (atom->empty() && atom_start == pos_) return Error("nothing to repeat");
      DH_ASSIGN_OR_RETURN(int32_t rep, b_->Repeat(NewName(), *atom, min, max));
      *atom = {GrammarBuilder::Ref(rep)};
      any = true;
    }
    return any;
  }

  Result<Seq> Atom() {
    const char32_t c = Next();
    switch (c) {
      case '(': {
        if (!AtEnd() && Peek() == '?') {
          Next();
          if (AtEnd()) return Error("unterminated group");
          const char32_t k = Next();
          if (k == ':') {
          } else if (k == '<' && !AtEnd() && Peek() != '=' && Peek() != '!') {
            while (!AtEnd() && Peek() != '>') Next();
            if (AtEnd()) return Error("unterminated group name");
            Next();
          } else if (k == 'P' && !AtEnd() && Peek() == '<') {
            while (!AtEnd() && Peek() != '>') Next();
            if (AtEnd()) return Error("unterminated group name");
            Next();
          } else {
            return Unsupp("lookaround and inline flags");
          }
        }
        // Groups recurse: bounded so a client's pattern cannot exhaust the stack.
        if (++group_depth_ > kMaxGroupDepth) {
          return Error(fmt::format("groups nested deeper than {}", kMaxGroupDepth));
        }
        DH_ASSIGN_OR_RETURN(int32_t rule, Alternation());
        --group_depth_;
        if (AtEnd() || Next() != ')') return Error("missing ')'");
        return Seq{GrammarBuilder::Ref(rule)};
      }
      case '[':
        return ClassAtom();
      case '.': {
        Ranges r = {{0, '\n' - 1}, {'\n' + 1, 0x10FFFF}};
        return SetSeq(r);
      }
      case '^':
        if (pos_ != 1) return Unsupp("'^' inside the pattern");
        return Seq{};
      case '$':
        if (!AtEnd()) return Unsupp("'$' inside the pattern");
        return Seq{};
      case '*':
      case '+':
      case '?':
        return Error("nothing to repeat");
      case '\\': {
        Ranges r;
        DH_RETURN_IF_ERROR(Escape(&r, /*in_class=*/false));
        return SetSeq(r);
      }
      default:
        return SetSeq({{c, c}});
    }
  }

  // After a backslash: fills `r` with the set the escape stands for.
  Status Escape(Ranges* r, bool in_class) {
    if (AtEnd()) return Error("trailing backslash");
    const char32_t c = Next();
    auto add = [&](Ranges x) { r->insert(r->end(), x.begin(), x.end()); };
    const Ranges digit = {{'0', '9'}};
    const Ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const Ranges space = {{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': add(digit); break;
      case 'D': add(ComplementRanges(digit)); break;
      case 'w': add(word); break;
      case 'W': add(ComplementRanges(word)); break;
      case 's': add(space); break;
      case 'S': add(ComplementRanges(space)); break;
      case 'n': add({{'\n', '\n'}}); break;
      case 't': add({{'\t', '\t'}}); break;
      case 'r': add({{'\r', '\r'}}); break;
      case 'f': add({{'\f', '\f'}}); break;
      case 'v': add({{'\v', '\v'}}); break;
      case '0': add({{0, 0}}); break;
      case 'x':
      case 'u': {
        const int digits = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          if (AtEnd()) return Error("short hex escape");
          const char32_t h = Next();
          int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (d < 0) return Error("bad hex escape");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        add({{v, v}});
        break;
      }
      case 'b':
        if (in_class) {
          add({{'\b', '\b'}});
          break;
        }
        return Unsupp("'\\b'");
      case 'B':
        return Unsupp("'\\B'");
      default:
        if ((c >= '1' && c <= '9') || c == 'k') return Unsupp("a backreference");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          return Unsupp(fmt::format("the escape '\\{}'", static_cast<char>(c)));
        add({{c, c}});
    }
    return Status::Ok();
  }

  Result<Seq> ClassAtom() {
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      Next();
      negate = true;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated '['");
      char32_t c = Peek();
      if (c == ']' && !first) {
        Next();
        break;
      }
      first = false;
      Ranges lo_set;
      Next();
      if (c == '\\') {
        DH_RETURN_IF_ERROR(Escape(&lo_set, /*in_class=*/true));
      } else {
        lo_set = {{c, c}};
      }
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && !AtEnd() && Peek() == '-' &&
          pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        Next();
        char32_t hi = Next();
        if (hi == '\\') {
          Ranges hs;
          DH_RETURN_IF_ERROR(Escape(&hs, true));
          if (hs.size() != 1 || hs[0].first != hs[0].second) return Error("bad class range");
          hi = hs[0].first;
        }
        if (hi < lo_set[0].first) return Error("class range out of order");
        lo_set[0].second = hi;
      }
      r.insert(r.end(), lo_set.begin(), lo_set.end());
    }
    return SetSeq(negate ? ComplementRanges(r) : r);
  }

  // One code point from `r` (minus what cannot sit raw in a JSON string when json_safe_).
  Result<Seq> SetSeq(Ranges r) {
    if (json_safe_) {
      Ranges banned = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
      Ranges allowed = ComplementRanges(banned);
      // Intersect r with allowed.
      Ranges out;
      for (auto [a, b] : NormalizeRanges(r)) {
        for (auto [c, d] : allowed) {
          const uint32_t lo = std::max(a, c), hi = std::min(b, d);
          if (lo <= hi) out.emplace_back(lo, hi);
        }
      }
      if (out.empty() && !r.empty()) return Unsupp("a character that needs escaping in JSON");
      r = std::move(out);
    }
    r = NormalizeRanges(r);
    if (r.size() == 1 && r[0].first == r[0].second) {
      std::string utf8;
      tok::AppendUtf8(static_cast<char32_t>(r[0].first), &utf8);
      return GrammarBuilder::Literal(utf8);
    }
    if (!r.empty() && r.back().second < 0x80) {
      ByteSet set;
      for (auto [a, b] : r) set.AddRange(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
      return Seq{GrammarBuilder::Bytes(set)};
    }
    return Seq{GrammarBuilder::Ref(b_->CodePointRanges(NewName(), r))};
  }

  GrammarBuilder* b_;
  std::string_view p_;
  size_t pos_ = 0;
  std::string name_;
  bool json_safe_;
  int counter_ = 0;
  static constexpr int kMaxGroupDepth = 100;
  int group_depth_ = 0;
};

}  // namespace

Result<int32_t> AddRegexRule(GrammarBuilder* builder, std::string_view pattern,
                             const std::string& name, bool json_string_safe) {
  if (pattern.size() > 4096) return InvalidArgument("regex: longer than 4096 bytes");
  DH_RETURN_IF_ERROR(tok::ValidateUtf8(pattern));
  RegexParser parser(builder, pattern, name, json_string_safe);
  return parser.Parse();
}

Result<Grammar> CompileRegex(std::string_view pattern) {
  GrammarBuilder b;
  const int32_t root = b.NewRule("root");
  DH_ASSIGN_OR_RETURN(int32_t rule, AddRegexRule(&b, pattern, "re", false));
  b.AddAlt(root, {GrammarBuilder::Ref(rule)});
  return b.Build();
}

Result<Grammar> CompileChoice(const std::vector<std::string>& choices) {
  if (choices.empty()) return InvalidArgument("choice: the list is empty");
  GrammarBuilder b;
  const int32_t root = b.NewRule("root");
  for (const std::string& c : choices) b.AddAlt(root, GrammarBuilder::Literal(c));
  return b.Build();
}

}  // namespace dh::grammar
