// Token byte strings, the preorder trie and the masked trie walk.
#include "grammar/token_mask.h"

#include <algorithm>
#include <numeric>

#include "tokenizer/utf8.h"

namespace dh::grammar {

namespace {

// The raw bytes of a vocabulary token: byte-level characters mapped back to bytes; a token with
// other characters (added, non-special tokens) is its UTF-8 text.
std::string TokenBytes(const Tokenizer& tokenizer, int32_t id) {
  if (tokenizer.IsSpecial(id)) return {};
  std::optional<std::string> token = tokenizer.IdToToken(id);
  if (!token) return {};
  const tok::ByteLevelTable& table = tok::GetByteLevelTable();
  std::string out;
  size_t pos = 0;
  while (pos < token->size()) {
    const char32_t cp = tok::NextCodePoint(*token, &pos);
    const int b = cp < table.char_to_byte.size() ? table.char_to_byte[cp] : -1;
    if (b < 0) {
      // Not byte-level: ask the decoder (Metaspace and friends).
      auto text = tokenizer.Decode(std::span<const int32_t>(&id, 1), false);
      return text.ok() ? *text : std::string();
    }
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace

std::shared_ptr<const TokenVocab> TokenVocab::FromTokenizer(const Tokenizer& tokenizer,
                                                            int32_t vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max(vocab_size, 0)));
  const int32_t n = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < n; ++id) bytes[id] = TokenBytes(tokenizer, id);
  return FromBytes(std::move(bytes));
}

std::shared_ptr<const TokenVocab> TokenVocab::FromBytes(std::vector<std::string> tokens) {
  auto v = std::shared_ptr<TokenVocab>(new TokenVocab());
  v->bytes_ = std::move(tokens);
  v->BuildTrie();
  return v;
}

void TokenVocab::BuildTrie() {
  std::vector<int32_t> order;
  for (int32_t i = 0; i < size(); ++i)
    if (!bytes_[i].empty()) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  Trie& t = trie_;
  std::vector<int32_t> path;  // path[d - 1]: open node at depth d
  std::vector<int32_t> counts;
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = bytes_[id];
    size_t lcp = 0;
    if (prev) {
      while (lcp < prev->size() && lcp < s.size() && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    // Close the open nodes deeper than the shared prefix.
    while (path.size() > lcp) {
      t.end[path.back()] = static_cast<int32_t>(t.byte.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(t.byte.size()));
      t.byte.push_back(static_cast<uint8_t>(s[d]));
      t.depth.push_back(static_cast<int32_t>(d + 1));
      t.end.push_back(0);
      counts.push_back(0);
      t.max_depth = std::max(t.max_depth, static_cast<int32_t>(d + 1));
    }
    ++counts[path.back()];
    t.token_ids.push_back(id);
    prev = &s;
  }
  for (int32_t node : path) t.end[node] = static_cast<int32_t>(t.byte.size());
  // Subtree byte sets, children into parents (preorder: a node's children follow it).
  t.below.resize(t.byte.size());
  for (size_t i = t.byte.size(); i-- > 0;) {
    t.below[i].Add(t.byte[i]);
    for (int32_t c = static_cast<int32_t>(i) + 1; c < t.end[i]; c = t.end[c]) {
      for (int w = 0; w < 4; ++w) t.below[i].bits[w] |= t.below[c].bits[w];
    }
  }
  t.tok_begin.assign(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), t.tok_begin.begin() + 1);
}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  // A byte's class is its membership in every byte set of the grammar.
  std::unordered_map<std::string, uint8_t> classes;
  std::string signature(grammar_.byte_sets.size(), '\0');
  for (int b = 0; b < 256; ++b) {
    for (size_t k = 0; k < grammar_.byte_sets.size(); ++k)
      signature[k] = grammar_.byte_sets[k].Has(static_cast<uint8_t>(b)) ? '1' : '0';
    auto [it, added] = classes.emplace(signature, static_cast<uint8_t>(classes.size()));
    byte_class_[b] = it->second;
    if (added) class_byte_[it->second] = static_cast<uint8_t>(b);
  }
  num_classes_ = static_cast<int32_t>(classes.size());
}

std::shared_ptr<const TokenBitmask> CompiledGrammar::Lookup(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

void CompiledGrammar::Store(const std::string& key, std::shared_ptr<const TokenBitmask> mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  // A bound on memory: 16 KiB per mask on a 129k vocabulary.
  if (cache_.size() >= 512) cache_.clear();
  cache_.emplace(key, std::move(mask));
}

TokenMatcher::TokenMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), matcher_(&grammar_->grammar()) {}

int32_t TokenMatcher::Intern(GrammarMatcher::Frame frame, size_t mark) {
  matcher_.FrameKey(frame, &key_);
  std::string key(reinterpret_cast<const char*>(key_.data()), key_.size() * sizeof(int32_t));
  auto [it, added] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (!added) {
    matcher_.Truncate(mark);  // the nodes of this step duplicate a known state's
    return it->second;
  }
  WalkState st;
  st.live = !frame.tops.empty();
  st.matches = st.live || frame.accepting;
  st.frame = std::move(frame);
  states_.push_back(std::move(st));
  trans_.resize(trans_.size() + static_cast<size_t>(grammar_->num_byte_classes()), -1);
  return it->second;
}

int32_t TokenMatcher::Transition(int32_t from, uint8_t byte) {
  const size_t slot = static_cast<size_t>(from) * static_cast<size_t>(grammar_->num_byte_classes()) +
                      grammar_->byte_class(byte);
  if (trans_[slot] >= 0) return trans_[slot];
  if (static_cast<int32_t>(states_.size()) >= kMaxWalkStates) return -1;
  const size_t mark = matcher_.ArenaSize();
  GrammarMatcher::Frame to;
  matcher_.Step(states_[from].frame, byte, &to);
  const int32_t next = Intern(std::move(to), mark);
  trans_[slot] = next;
  return next;
}

void TokenMatcher::ComputeLoop(int32_t state) {
  ByteSet loop;
  for (int32_t c = 0; c < grammar_->num_byte_classes(); ++c) {
    const int32_t next = Transition(state, grammar_->class_byte(c));
    if (next < 0) {  // out of states: no shortcut from here
      loop = ByteSet{};
      break;
    }
    if (next != state) continue;
    for (int b = 0; b < 256; ++b) {
      if (grammar_->byte_class(static_cast<uint8_t>(b)) == c) loop.Add(static_cast<uint8_t>(b));
    }
  }
  states_[state].loop = loop;
  states_[state].loop_known = true;
}

TokenBitmask TokenMatcher::ComputeMask() {
  const TokenVocab& vocab = grammar_->vocab();
  const TokenVocab::Trie& t = vocab.trie();
  const int32_t ncls = grammar_->num_byte_classes();
  states_.clear();
  trans_.clear();
  state_ids_.clear();
  at_depth_.resize(static_cast<size_t>(t.max_depth) + 1);
  const size_t base = matcher_.ArenaSize();
  at_depth_[0] = Intern(matcher_.frame(), base);
  TokenBitmask mask((static_cast<size_t>(vocab.size()) + 63) / 64, 0);
  const int32_t n = static_cast<int32_t>(t.byte.size());
  for (int32_t i = 0; i < n;) {
    const int32_t d = t.depth[i];
    const int32_t from = at_depth_[d - 1];
    const size_t slot = static_cast<size_t>(from) * static_cast<size_t>(ncls) + grammar_->byte_class(t.byte[i]);
    int32_t next = trans_[slot];
    if (next < 0) {
      next = Transition(from, t.byte[i]);
      if (next < 0) {
        matcher_.Truncate(base);
        return ComputeMaskStepping();
      }
    }
    if (next == from) {
      // A self-loop: a subtree whose bytes all keep the state here matches whole.
      if (!states_[next].loop_known) ComputeLoop(next);
      const ByteSet& loop = states_[next].loop;
      const ByteSet& below = t.below[i];
      if (((below.bits[0] & ~loop.bits[0]) | (below.bits[1] & ~loop.bits[1]) |
           (below.bits[2] & ~loop.bits[2]) | (below.bits[3] & ~loop.bits[3])) == 0) {
        for (int32_t k = t.tok_begin[i]; k < t.tok_begin[t.end[i]]; ++k) {
          const int32_t id = t.token_ids[k];
          mask[id >> 6] |= uint64_t{1} << (id & 63);
        }
        i = t.end[i];
        continue;
      }
    }
    const WalkState& st = states_[next];
    if (!st.matches) {
      i = t.end[i];  // no token under this prefix can match
      continue;
    }
    for (int32_t k = t.tok_begin[i]; k < t.tok_begin[i + 1]; ++k) {
      const int32_t id = t.token_ids[k];
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    }
    at_depth_[d] = next;
    i = st.live ? i + 1 : t.end[i];
  }
  matcher_.Truncate(base);
  return mask;
}

TokenBitmask TokenMatcher::ComputeMaskStepping() {
  const TokenVocab& vocab = grammar_->vocab();
  const TokenVocab::Trie& t = vocab.trie();
  TokenBitmask mask((static_cast<size_t>(vocab.size()) + 63) / 64, 0);
  frames_.resize(static_cast<size_t>(t.max_depth) + 1);
  marks_.resize(frames_.size());
  frames_[0] = matcher_.frame();
  const size_t base = matcher_.ArenaSize();
  marks_[0] = base;
  const int32_t n = static_cast<int32_t>(t.byte.size());
  for (int32_t i = 0; i < n;) {
    const int32_t d = t.depth[i];
    matcher_.Truncate(marks_[d - 1]);
    GrammarMatcher::Frame& to = frames_[d];
    matcher_.Step(frames_[d - 1], t.byte[i], &to);
    marks_[d] = matcher_.ArenaSize();
    if (to.tops.empty() && !to.accepting) {
      i = t.end[i];  // no token under this prefix can match
      continue;
    }
    for (int32_t k = t.tok_begin[i]; k < t.tok_begin[i + 1]; ++k) {
      const int32_t id = t.token_ids[k];
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    }
    i = to.tops.empty() ? t.end[i] : i + 1;
  }
  matcher_.Truncate(base);
  return mask;
}

std::shared_ptr<const TokenBitmask> TokenMatcher::AllowedTokens() {
  matcher_.StateKey(&key_);
  std::string key(reinterpret_cast<const char*>(key_.data()), key_.size() * sizeof(int32_t));
  if (auto hit = grammar_->Lookup(key)) return hit;
  auto mask = std::make_shared<const TokenBitmask>(ComputeMask());
  grammar_->Store(key, mask);
  return mask;
}

bool TokenMatcher::AcceptToken(int32_t id) {
  if (id < 0 || id >= grammar_->vocab().size()) return false;
  const std::string& bytes = grammar_->vocab().bytes(id);
  if (bytes.empty()) return false;
  return AcceptBytes(bytes);
}

bool TokenMatcher::AcceptBytes(std::string_view bytes) {
  GrammarMatcher copy = matcher_;
  if (!copy.AcceptBytes(bytes)) return false;
  matcher_ = std::move(copy);
  return true;
}

}  // namespace dh::grammar
