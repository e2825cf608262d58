// Grammar: a context-free grammar over bytes, and a pushdown recognizer for it.
//
// Every compiler in this folder (JSON Schema, GBNF, regex, choice lists) lowers its input to a
// Grammar: rules of alternatives, each a sequence of byte classes and rule references. The
// GrammarMatcher runs it one byte at a time over a set of stacks of rule positions (one stack per
// live parse), so ambiguous grammars are fine; left recursion is rejected when the grammar is
// built, because a top-down recognizer would never stop expanding it.
//
// Invariants: rule 0 is the start rule; a tail call (a reference at the end of an alternative)
// does not grow the stack, so right-recursive repetition runs in constant stack depth.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dh::grammar {

// A set of bytes.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteSet&) const = default;
};

// One element of an alternative: a byte class or a reference to a rule.
struct Element {
  enum Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = kEnd;
  int32_t value = 0;  // kBytes: index into byte_sets; kRule: rule id
};

// A compiled grammar. `elements` holds every alternative as a run of elements closed by kEnd;
// `rules[r]` lists the start offsets of rule r's alternatives.
struct Grammar {
  std::vector<Element> elements;
  std::vector<ByteSet> byte_sets;
  std::vector<std::vector<int32_t>> rules;
  std::vector<std::string> rule_names;
};

// Builds a Grammar. Alternatives are written as vectors of Items; Build() checks that every rule
// is defined and that there is no left recursion.
class GrammarBuilder {
 public:
  struct Item {
    bool is_rule = false;
    int32_t rule = 0;
    ByteSet bytes;
  };
  using Seq = std::vector<Item>;

  // Declares a rule (defined later with AddAlt); the first one declared is the start rule.
  int32_t NewRule(std::string name);
  void AddAlt(int32_t rule, Seq seq);
  int32_t num_rules() const { return static_cast<int32_t>(alts_.size()); }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }

  static Item Ref(int32_t rule) { return Item{true, rule, {}}; }
  static Item Bytes(const ByteSet& set) { return Item{false, 0, set}; }
  static Item Byte(uint8_t b) {
    ByteSet s;
    s.Add(b);
    return Bytes(s);
  }
  // Appends the bytes of `text` as single-byte items.
  static void AppendLiteral(Seq* seq, std::string_view text);
  static Seq Literal(std::string_view text) {
    Seq s;
    AppendLiteral(&s, text);
    return s;
  }

  // Helpers that define new rules. Repeat: `body` between min and max times (max < 0:
  // unbounded); `separator` (may be empty) between consecutive copies. Errors when the bounds
  // would make the grammar larger than kMaxRepeatExpansion.
  Result<int32_t> Repeat(const std::string& name, const Seq& body, int64_t min, int64_t max,
                         const Seq& separator = {});
  // A rule matching any one Unicode scalar value in [lo, hi] encoded as UTF-8 (surrogates never
  // match), optionally minus the code points in `exclude` (sorted, disjoint ranges).
  int32_t CodePointRanges(const std::string& name,
                          const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

  Result<Grammar> Build() const;

  static constexpr int64_t kMaxRepeatExpansion = 4096;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<Seq>> alts_;
  std::vector<bool> defined_;
};

// Normalizes ranges of code points: sorts, merges, removes the surrogate block.
std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges);
// The complement within [0, 0x10FFFF].
std::vector<std::pair<uint32_t, uint32_t>> ComplementRanges(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

// Runs a Grammar byte by byte. Copyable (a copy is an independent parse position).
class GrammarMatcher {
 public:
  explicit GrammarMatcher(const Grammar* grammar);

  // Advances by one byte; false (and no change) when the byte cannot continue any parse.
  bool AcceptByte(uint8_t byte);
  bool AcceptBytes(std::string_view bytes);
  // True when the input so far is a complete sentence of the grammar.
  bool IsAccepting() const { return accepting_; }
  // True when no more bytes can be accepted (accepting or dead).
  bool IsDone() const { return tops_.empty(); }
  // True when `bytes` could follow (state unchanged).
  bool CanAccept(std::string_view bytes) const;

  // A canonical key for the current set of parses: equal keys mean equal futures. Used to cache
  // token masks.
  void StateKey(std::vector<int32_t>* key) const;

  // Trie walks (token_mask.cc) advance a scratch copy; these expose the raw step.
  struct Frame {
    std::vector<int32_t> tops;
    bool accepting = false;
  };
  Frame frame() const { return {tops_, accepting_}; }
  // StateKey of a frame built on this matcher's arena (a trie walk's scratch frame).
  void FrameKey(const Frame& frame, std::vector<int32_t>* key) const;
  // Steps `from` by `byte` into `to` using (and growing) this matcher's node arena. Nodes
  // created after `mark` may be dropped with Truncate(mark).
  void Step(const Frame& from, uint8_t byte, Frame* to);
  size_t ArenaSize() const { return nodes_.size(); }
  void Truncate(size_t mark) { nodes_.resize(mark); }
  const Grammar& grammar() const { return *grammar_; }

 private:
  struct Node {
    int32_t pos;     // index into grammar.elements
    int32_t parent;  // node to return to; -1: the start rule's caller
  };
  // Expands node `id` until every resulting stack has a byte class on top; appends those to
  // `tops` and sets *accepting when a stack completes.
  void Close(int32_t id, std::vector<int32_t>* tops, bool* accepting, int depth);
  int32_t NewNode(int32_t pos, int32_t parent);
  void Compact();

  const Grammar* grammar_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tops_;
  bool accepting_ = false;
};

}  // namespace dh::grammar
