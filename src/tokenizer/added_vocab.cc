// Added-token matching (see added_vocab.h).
#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace dh::tok {
namespace {

bool IsWordChar(char32_t cp) { return cp == '_' || IsAlphanumeric(cp); }

// The code point ending just before `pos` (pos > 0).
char32_t PrevCodePoint(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(s, &start);
}

}  // namespace

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  const auto& ch = nodes_[node].children;
  auto it = std::lower_bound(ch.begin(), ch.end(), byte,
                             [](const auto& p, uint8_t b) { return p.first < b; });
  return it != ch.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::Build(const std::vector<AddedToken>* tokens,
                              const std::vector<int>& indices,
                              const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  nodes_.assign(1, Node{});
  token_of_pattern_.clear();
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;
    int32_t node = 0;
    for (char c : p) {
      const auto b = static_cast<uint8_t>(c);
      int32_t next = Child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        auto& ch = nodes_[node].children;
        ch.insert(std::lower_bound(ch.begin(), ch.end(), std::make_pair(b, int32_t{-1})),
                  {b, next});
      }
      node = next;
    }
    if (nodes_[node].pattern < 0) {  // the first token with this text wins
      nodes_[node].pattern = static_cast<int32_t>(token_of_pattern_.size());
      token_of_pattern_.push_back(indices[i]);
    }
    first_byte_[static_cast<uint8_t>(p[0])] = true;
  }
}

std::vector<Segment> AddedTokenMatcher::Split(std::string_view text) const {
  std::vector<Segment> out;
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    // Longest pattern starting at pos.
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].pattern >= 0) {
        best = nodes_[node].pattern;
        best_end = i + 1;
      }
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = (*tokens_)[token_of_pattern_[best]];
    size_t start = pos, stop = best_end;
    if (token.single_word) {
      const bool left_ok = start == 0 || !IsWordChar(PrevCodePoint(text, start));
      size_t p = stop;
      const bool right_ok = stop == text.size() || !IsWordChar(NextCodePoint(text, &p));
      if (!left_ok || !right_ok) {
        pos = best_end;
        continue;
      }
    }
    if (token.lstrip) {
      while (start > plain_start) {
        size_t back = start - 1;
        while (back > plain_start && (static_cast<uint8_t>(text[back]) & 0xC0) == 0x80) --back;
        size_t p = back;
        if (!IsWhitespace(NextCodePoint(text, &p))) break;
        start = back;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t p = stop;
        if (!IsWhitespace(NextCodePoint(text, &p))) break;
        stop = p;
      }
    }
    if (start > plain_start) out.push_back({plain_start, start, -1});
    out.push_back({start, stop, token.id});
    plain_start = pos = stop;
  }
  if (plain_start < text.size()) out.push_back({plain_start, text.size(), -1});
  return out;
}

}  // namespace dh::tok
