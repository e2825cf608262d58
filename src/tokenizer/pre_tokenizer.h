// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split (PCRE2 regex or literal, all five
// behaviours, invert), ByteLevel, Metaspace, Digits, Punctuation, Whitespace, WhitespaceSplit,
// BertPreTokenizer and Sequence. Pieces are spans over one buffer so splitting copies nothing.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace dh::tok {

struct PieceList {
  std::string text;                              // valid UTF-8
  std::vector<std::pair<size_t, size_t>> spans;  // non-empty [begin, end) ranges, in order
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // `at_input_start`: the text begins at offset 0 of the user's input (Metaspace "first").
  virtual Status Apply(PieceList* pieces, bool at_input_start) const = 0;
};

Result<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& spec,
                                                        const std::string& where);

// Applies `behavior` to a piece [0, len) whose matches are `matches` (sorted, non-overlapping)
// and appends the resulting non-empty spans, shifted by `base`, to *out. Exposed for tests.
void SplitByMatches(size_t base, size_t len, const std::vector<std::pair<size_t, size_t>>& matches,
                    SplitBehavior behavior, bool invert,
                    std::vector<std::pair<size_t, size_t>>* out);

}  // namespace dh::tok
