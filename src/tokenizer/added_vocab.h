// Added tokens ("added_tokens" of tokenizer.json) and how they are cut out of the input before
// the model sees it: leftmost-longest matching over a byte trie (like `tokenizers`' Aho-Corasick
// with LeftmostLongest), honouring single_word, lstrip and rstrip.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dh::tok {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A piece of input: either plain text [begin, end) or an added token's id (covering [begin, end)).
struct Segment {
  size_t begin, end;
  int32_t id;  // -1 for plain text
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text matched for `tokens[i]` (its content, normalized when required).
  void Build(const std::vector<AddedToken>* tokens, const std::vector<int>& indices,
             const std::vector<std::string>& patterns);
  bool empty() const { return token_of_pattern_.empty(); }
  // Splits `text` into plain-text and token segments (plain segments may be empty-free).
  std::vector<Segment> Split(std::string_view text) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t pattern = -1;
  };
  int32_t Child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_;
  std::vector<int> token_of_pattern_;  // index into *tokens_
  const std::vector<AddedToken>* tokens_ = nullptr;
  bool first_byte_[256] = {};
};

}  // namespace dh::tok
