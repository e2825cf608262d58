// Grammar construction (with the left-recursion check) and the stack-set recognizer.
#include "grammar/grammar.h"

#include <algorithm>
#include <functional>

#include <fmt/format.h>

namespace dh::grammar {

void GrammarBuilder::AppendLiteral(Seq* seq, std::string_view text) {
  for (char c : text) seq->push_back(Byte(static_cast<uint8_t>(c)));
}

int32_t GrammarBuilder::NewRule(std::string name) {
  names_.push_back(std::move(name));
  alts_.emplace_back();
  defined_.push_back(false);
  return static_cast<int32_t>(alts_.size() - 1);
}

void GrammarBuilder::AddAlt(int32_t rule, Seq seq) {
  alts_[rule].push_back(std::move(seq));
  defined_[rule] = true;
}

Result<int32_t> GrammarBuilder::Repeat(const std::string& name, const Seq& body, int64_t min,
                                       int64_t max, const Seq& separator) {
  if (min < 0 || (max >= 0 && max < min))
    return InvalidArgument("{}: bounds {}..{} are empty", name, min, max);
  const int64_t copies = max >= 0 ? max : min;
  if (copies > kMaxRepeatExpansion)
    return InvalidArgument("{}: a repetition bound of {} is above the limit of {}", name, copies,
                           kMaxRepeatExpansion);
  const int32_t item = NewRule(name + "-item");
  AddAlt(item, body);
  auto sep_item = [&] {
    Seq s = separator;
    s.push_back(Ref(item));
    return s;
  };
  // tail: what may follow the first `min` copies.
  int32_t tail = NewRule(name + "-tail");
  if (max < 0) {
    Seq s = sep_item();
    s.push_back(Ref(tail));
    AddAlt(tail, s);
    AddAlt(tail, {});
  } else {
    AddAlt(tail, {});
    const int64_t optional = min == 0 ? max - 1 : max - min;
    for (int64_t k = 0; k < optional; ++k) {
      const int32_t next = NewRule(fmt::format("{}-opt{}", name, k + 1));
      Seq s = sep_item();
      s.push_back(Ref(tail));
      AddAlt(next, s);
      AddAlt(next, {});
      tail = next;
    }
  }
  const int32_t rule = NewRule(name);
  if (min == 0) {
    if (max != 0) AddAlt(rule, {Ref(item), Ref(tail)});
    AddAlt(rule, {});
    return rule;
  }
  Seq s = {Ref(item)};
  for (int64_t i = 1; i < min; ++i) {
    Seq si = sep_item();
    s.insert(s.end(), si.begin(), si.end());
  }
  s.push_back(Ref(tail));
  AddAlt(rule, s);
  return rule;
}

std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  std::vector<std::pair<uint32_t, uint32_t>> cut;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {  // drop the surrogate block
      cut.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) cut.emplace_back(0xE000, hi);
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) cut.emplace_back(0xE000, hi);
    } else {
      cut.emplace_back(lo, hi);
    }
  }
  std::sort(cut.begin(), cut.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto r : cut) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;
  for (auto [lo, hi] : NormalizeRanges(ranges)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
  return NormalizeRanges(out);
}

namespace {

int Utf8Length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::vector<uint8_t> EncodeUtf8(uint32_t cp) {
  if (cp < 0x80) return {static_cast<uint8_t>(cp)};
  if (cp < 0x800) return {static_cast<uint8_t>(0xC0 | (cp >> 6)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  if (cp < 0x10000)
    return {static_cast<uint8_t>(0xE0 | (cp >> 12)), static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)),
            static_cast<uint8_t>(0x80 | (cp & 0x3F))};
  return {static_cast<uint8_t>(0xF0 | (cp >> 18)), static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)),
          static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)), static_cast<uint8_t>(0x80 | (cp & 0x3F))};
}

// Splits [lo, hi] (same UTF-8 length) into pieces whose encodings are products of byte ranges.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  const int len = Utf8Length(lo);
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::vector<uint8_t> a = EncodeUtf8(lo), b = EncodeUtf8(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

}  // namespace

int32_t GrammarBuilder::CodePointRanges(const std::string& name,
                                        const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  const int32_t rule = NewRule(name);
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> pieces;
  for (auto [lo, hi] : NormalizeRanges(ranges)) {
    const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    for (uint32_t b : bounds) {
      if (lo > hi) break;
      if (lo > b) continue;
      const uint32_t end = std::min(hi, b);
      SplitUtf8(lo, end, &pieces);
      lo = end + 1;
    }
  }
  // Single-byte pieces share one alternative.
  ByteSet ascii;
  bool any_ascii = false;
  for (const auto& p : pieces) {
    if (p.size() == 1) {
      ascii.AddRange(p[0].first, p[0].second);
      any_ascii = true;
      continue;
    }
    Seq s;
    for (auto [a, b] : p) {
      ByteSet set;
      set.AddRange(a, b);
      s.push_back(Bytes(set));
    }
    AddAlt(rule, s);
  }
  if (any_ascii) AddAlt(rule, {Bytes(ascii)});
  defined_[rule] = true;  // an empty set of ranges is a rule that matches nothing
  return rule;
}

Result<Grammar> GrammarBuilder::Build() const {
  const int32_t n = num_rules();
  if (n == 0) return InvalidArgument("grammar: no rules");
  for (int32_t r = 0; r < n; ++r) {
    if (!defined_[r]) return InvalidArgument("grammar: rule '{}' is used but not defined", names_[r]);
  }
  // Nullable rules, to the fixpoint.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& alt : alts_[r]) {
        bool all = true;
        for (const Item& it : alt) {
          if (!it.is_rule || !nullable[it.rule]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a cycle among "may call first" edges.
  std::vector<std::vector<int32_t>> first(n);
  for (int32_t r = 0; r < n; ++r) {
    for (const Seq& alt : alts_[r]) {
      for (const Item& it : alt) {
        if (!it.is_rule) break;
        first[r].push_back(it.rule);
        if (!nullable[it.rule]) break;
      }
    }
  }
  std::vector<int8_t> color(n, 0);
  std::string cycle_at;
  std::function<bool(int32_t)> visit = [&](int32_t r) {
    color[r] = 1;
    for (int32_t s : first[r]) {
      if (color[s] == 1) {
        cycle_at = names_[s];
        return true;
      }
      if (color[s] == 0 && visit(s)) return true;
    }
    color[r] = 2;
    return false;
  };
  for (int32_t r = 0; r < n; ++r) {
    if (color[r] == 0 && visit(r))
      return InvalidArgument("grammar: rule '{}' is left-recursive", cycle_at);
  }

  Grammar g;
  g.rule_names = names_;
  g.rules.resize(n);
  for (int32_t r = 0; r < n; ++r) {
    for (const Seq& alt : alts_[r]) {
      g.rules[r].push_back(static_cast<int32_t>(g.elements.size()));
      for (const Item& it : alt) {
        if (it.is_rule) {
          g.elements.push_back({Element::kRule, it.rule});
          continue;
        }
        auto found = std::find(g.byte_sets.begin(), g.byte_sets.end(), it.bytes);
        if (found == g.byte_sets.end()) {
          g.byte_sets.push_back(it.bytes);
          found = g.byte_sets.end() - 1;
        }
        g.elements.push_back({Element::kBytes, static_cast<int32_t>(found - g.byte_sets.begin())});
      }
      g.elements.push_back({Element::kEnd, 0});
    }
  }
  return g;
}

// ---------------------------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(const Grammar* grammar) : grammar_(grammar) {
  for (int32_t start : grammar_->rules[0]) Close(NewNode(start, -1), &tops_, &accepting_, 0);
  std::sort(tops_.begin(), tops_.end());
  tops_.erase(std::unique(tops_.begin(), tops_.end()), tops_.end());
}

int32_t GrammarMatcher::NewNode(int32_t pos, int32_t parent) {
  nodes_.push_back({pos, parent});
  return static_cast<int32_t>(nodes_.size() - 1);
}

void GrammarMatcher::Close(int32_t id, std::vector<int32_t>* tops, bool* accepting, int depth) {
  // Without left recursion the depth is bounded by the number of rules; the guard only protects
  // against a grammar built around Build().
  if (depth > static_cast<int>(grammar_->rules.size()) + 2) return;
  const Node node = nodes_[id];
  const Element& el = grammar_->elements[node.pos];
  switch (el.kind) {
    case Element::kBytes:
      tops->push_back(id);
      return;
    case Element::kEnd:
      if (node.parent < 0) {
        *accepting = true;
      } else {
        Close(node.parent, tops, accepting, depth + 1);
      }
      return;
    case Element::kRule: {
      const bool tail = grammar_->elements[node.pos + 1].kind == Element::kEnd;
      const int32_t ret = tail ? node.parent : NewNode(node.pos + 1, node.parent);
      for (int32_t start : grammar_->rules[el.value]) Close(NewNode(start, ret), tops, accepting, depth + 1);
      return;
    }
  }
}

void GrammarMatcher::Step(const Frame& from, uint8_t byte, Frame* to) {
  to->tops.clear();
  to->accepting = false;
  for (int32_t id : from.tops) {
    const Node node = nodes_[id];
    if (!grammar_->byte_sets[grammar_->elements[node.pos].value].Has(byte)) continue;
    Close(NewNode(node.pos + 1, node.parent), &to->tops, &to->accepting, 0);
  }
  if (to->tops.size() > 1) {
    // Same position with the same return stack: one parse.
    std::sort(to->tops.begin(), to->tops.end(), [&](int32_t a, int32_t b) {
      const Node &x = nodes_[a], &y = nodes_[b];
      return x.pos != y.pos ? x.pos < y.pos : x.parent < y.parent;
    });
    to->tops.erase(std::unique(to->tops.begin(), to->tops.end(),
                               [&](int32_t a, int32_t b) {
                                 return nodes_[a].pos == nodes_[b].pos &&
                                        nodes_[a].parent == nodes_[b].parent;
                               }),
                   to->tops.end());
  }
}

bool GrammarMatcher::AcceptByte(uint8_t byte) {
  Frame from{tops_, accepting_}, to;
  const size_t mark = nodes_.size();
  Step(from, byte, &to);
  if (to.tops.empty() && !to.accepting) {
    Truncate(mark);
    return false;
  }
  tops_ = std::move(to.tops);
  accepting_ = to.accepting;
  if (nodes_.size() > 4096 && nodes_.size() > 8 * tops_.size() * 16) Compact();
  return true;
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  for (char c : bytes) {
    if (!AcceptByte(static_cast<uint8_t>(c))) return false;
  }
  return true;
}

bool GrammarMatcher::CanAccept(std::string_view bytes) const {
  GrammarMatcher copy = *this;
  return copy.AcceptBytes(bytes);
}

void GrammarMatcher::Compact() {
  std::vector<Node> kept;
  std::vector<int32_t> remap(nodes_.size(), -1);
  std::function<int32_t(int32_t)> copy = [&](int32_t id) -> int32_t {
    if (id < 0) return -1;
    if (remap[id] >= 0) return remap[id];
    const int32_t parent = copy(nodes_[id].parent);
    kept.push_back({nodes_[id].pos, parent});
    return remap[id] = static_cast<int32_t>(kept.size() - 1);
  };
  for (int32_t& t : tops_) t = copy(t);
  nodes_ = std::move(kept);
}

void GrammarMatcher::StateKey(std::vector<int32_t>* key) const {
  FrameKey(Frame{tops_, accepting_}, key);
}

void GrammarMatcher::FrameKey(const Frame& frame, std::vector<int32_t>* key) const {
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t id : frame.tops) {
    std::vector<int32_t> s;
    for (int32_t n = id; n >= 0; n = nodes_[n].parent) s.push_back(nodes_[n].pos);
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  key->clear();
  key->push_back(frame.accepting ? 1 : 0);
  for (const auto& s : stacks) {
    key->insert(key->end(), s.begin(), s.end());
    key->push_back(-1);
  }
}

}  // namespace dh::grammar
