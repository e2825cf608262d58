// Token masks: which tokens of the real vocabulary may come next under a grammar.
//
// TokenVocab holds every token's bytes (byte-level BPE tokens mapped back to raw bytes) in a trie
// stored in preorder, so one mask is a single walk that advances the grammar byte by byte and
// skips a whole subtree as soon as its prefix is rejected. A token that crosses a grammar
// boundary (closes a string and opens the next key) is just a longer walk. Special tokens never
// match bytes; EOS is the caller's business (allowed only in accepting states).
//
// The walk itself runs over a small automaton built as it goes: each distinct parse state met
// during the walk (canonical key, as for the cache) gets an id and a transition row over the
// grammar's byte classes (bytes no byte set tells apart), filled on first use with one grammar
// step. Inside a JSON string almost every trie node leads back to the same few states, so the
// walk is one table lookup per trie node after the first few steps, even from a state never seen
// before. A state that a byte leads back to itself (a string body, digits, spaces) also learns
// the set of such bytes, and a trie subtree whose bytes all lie in that set is taken whole
// without walking it. Past kMaxWalkStates distinct states the mask is computed by the plain
// stepping walk.
//
// Masks are cached per grammar keyed by the parse state, since JSON revisits the same states
// (inside a string, after a comma) over and over.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace dh::grammar {

class TokenVocab {
 public:
  // `vocab_size`: the logits width (may exceed the tokenizer's; extra ids never match).
  static std::shared_ptr<const TokenVocab> FromTokenizer(const Tokenizer& tokenizer,
                                                         int32_t vocab_size);
  // For tests: token i has bytes tokens[i] (empty: never allowed).
  static std::shared_ptr<const TokenVocab> FromBytes(std::vector<std::string> tokens);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

  // Preorder trie: node i has `byte_[i]`, `depth_[i]` (root children: 1) and its subtree ends
  // before `end_[i]`; tokens spelled by the path to node i are token_ids_[tok_begin_[i] ..
  // tok_begin_[i + 1]).
  struct Trie {
    std::vector<uint8_t> byte;
    std::vector<int32_t> depth, end, tok_begin, token_ids;
    std::vector<ByteSet> below;  // the bytes of node i's subtree (its own byte included)
    int32_t max_depth = 0;
  };
  const Trie& trie() const { return trie_; }

 private:
  void BuildTrie();
  std::vector<std::string> bytes_;
  Trie trie_;
};

// A bitset over the vocabulary.
using TokenBitmask = std::vector<uint64_t>;
inline bool TestBit(const TokenBitmask& m, int32_t id) { return (m[id >> 6] >> (id & 63)) & 1; }

// A grammar plus its mask cache, shared by every sequence that uses it.
class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab);
  const Grammar& grammar() const { return grammar_; }
  const TokenVocab& vocab() const { return *vocab_; }
  // Bytes that every byte set of the grammar treats alike share a class.
  int32_t num_byte_classes() const { return num_classes_; }
  uint8_t byte_class(uint8_t b) const { return byte_class_[b]; }
  uint8_t class_byte(int32_t c) const { return class_byte_[c]; }  // one byte of class c

  std::shared_ptr<const TokenBitmask> Lookup(const std::string& key) const;
  void Store(const std::string& key, std::shared_ptr<const TokenBitmask> mask) const;

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenVocab> vocab_;
  std::array<uint8_t, 256> byte_class_{};
  std::array<uint8_t, 256> class_byte_{};
  int32_t num_classes_ = 0;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const TokenBitmask>> cache_;
};

// One sequence's position in a grammar.
class TokenMatcher {
 public:
  explicit TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Tokens that may come next (EOS not included: see IsAccepting).
  std::shared_ptr<const TokenBitmask> AllowedTokens();
  // Same without the cache (benchmarks and tests).
  TokenBitmask ComputeMask();
  // The plain walk: one grammar step per trie node (tests compare the two).
  TokenBitmask ComputeMaskStepping();
  static constexpr int32_t kMaxWalkStates = 1 << 14;
  bool IsAccepting() const { return matcher_.IsAccepting(); }
  bool IsDone() const { return matcher_.IsDone(); }
  // Advances by the token's bytes; false (state unchanged) when the grammar rejects them.
  bool AcceptToken(int32_t id);
  bool AcceptBytes(std::string_view bytes);

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  GrammarMatcher matcher_;
  std::vector<GrammarMatcher::Frame> frames_;
  std::vector<size_t> marks_;
  std::vector<int32_t> key_;
  // The walk's automaton (reused between walks to keep its allocations).
  struct WalkState {
    GrammarMatcher::Frame frame;
    bool live = false;       // bytes may follow
    bool matches = false;    // the bytes so far may end a token here (live or accepting)
    bool loop_known = false;
    ByteSet loop;            // bytes that lead from this state back to itself
  };
  void ComputeLoop(int32_t state);
  int32_t Transition(int32_t from, uint8_t byte);  // -1: over kMaxWalkStates
  std::vector<WalkState> states_;
  std::vector<int32_t> trans_;  // states_ x byte classes; -1: not computed
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<int32_t> at_depth_;
  int32_t Intern(GrammarMatcher::Frame frame, size_t mark);
};

}  // namespace dh::grammar
