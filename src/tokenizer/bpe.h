// The BPE model of tokenizer.json: vocab, merges (as "a b" strings or ["a", "b"] pairs),
// byte_fallback, ignore_merges, unk_token (+fuse_unk), continuing_subword_prefix and
// end_of_word_suffix. Merging is a linked list plus a min-heap of candidate pairs (O(n log n)
// per word, no recursion); results for short words are cached.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace dh::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // `spec` is tokenizer.json's "model" object.
  static Result<std::unique_ptr<BpeModel>> Parse(const nlohmann::json& spec,
                                                 const std::string& where);

  // Appends the ids of one pre-tokenized word.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when `id` has no vocab entry.
  const std::string* IdToToken(int32_t id) const;
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void MergeWord(std::string_view word, std::vector<int32_t>* ids) const;
  const Merge* FindMerge(int32_t a, int32_t b) const;

  // Open-addressing table of merges keyed by PairKey (the hot lookup of MergeWord).
  struct MergeSlot {
    uint64_t key = ~uint64_t{0};
    Merge merge{};
  };
  std::vector<MergeSlot> merge_table_;
  std::vector<int32_t> new_id_by_rank_;
  uint64_t merge_mask_ = 0;

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_token_;
  std::array<int32_t, 128> ascii_ids_;  // ids of one-character ASCII tokens, -1 if absent
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_, suffix_;
  std::vector<int32_t> byte_ids_;  // <0xXX> ids, -1 when absent (byte_fallback)

  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace dh::tok
